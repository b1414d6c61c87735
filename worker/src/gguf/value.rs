//! Metadata values and the insertion-ordered key/value table of a GGUF file.

use std::collections::HashMap;

use super::error::GgufError;

/// GGUF metadata value type ids, as stored in the file (`gguf_type` in ggml).
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value. GGUF arrays are homogeneous; nested arrays each carry
/// their own element type, so `Array(vec![Array(u8s), Array(strings)])` is fine.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// Any integer type, if it is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// `F32`, `F64` (narrowed) or any integer (converted, possibly rounded):
    /// some converters store float hyperparameters such as `rope.freq_base`
    /// as integers or doubles, and the model only ever wants an `f32`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => self
                .as_i64()
                .map(|v| v as f32)
                .or_else(|| self.as_u64().map(|v| v as f32)),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the value's type: "u32", "string", "array", ...
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// The value type id written to the file.
    pub(crate) fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => type_id::U8,
            MetaValue::I8(_) => type_id::I8,
            MetaValue::U16(_) => type_id::U16,
            MetaValue::I16(_) => type_id::I16,
            MetaValue::U32(_) => type_id::U32,
            MetaValue::I32(_) => type_id::I32,
            MetaValue::U64(_) => type_id::U64,
            MetaValue::I64(_) => type_id::I64,
            MetaValue::F32(_) => type_id::F32,
            MetaValue::F64(_) => type_id::F64,
            MetaValue::Bool(_) => type_id::BOOL,
            MetaValue::String(_) => type_id::STRING,
            MetaValue::Array(_) => type_id::ARRAY,
        }
    }

    /// "array of <element type>", for error messages about arrays whose
    /// elements are not what the caller asked for.
    fn array_type_name(elem: &MetaValue) -> &'static str {
        match elem {
            MetaValue::U8(_) => "array of u8",
            MetaValue::I8(_) => "array of i8",
            MetaValue::U16(_) => "array of u16",
            MetaValue::I16(_) => "array of i16",
            MetaValue::U32(_) => "array of u32",
            MetaValue::I32(_) => "array of i32",
            MetaValue::U64(_) => "array of u64",
            MetaValue::I64(_) => "array of i64",
            MetaValue::F32(_) => "array of f32",
            MetaValue::F64(_) => "array of f64",
            MetaValue::Bool(_) => "array of bool",
            MetaValue::String(_) => "array of string",
            MetaValue::Array(_) => "array of array",
        }
    }
}

/// The metadata key/value table, in file order, with O(1) lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a key; a key may appear only once (ggml refuses duplicates too,
    /// and silently keeping either copy would hide a corrupt file).
    pub fn insert(&mut self, key: &str, value: MetaValue) -> Result<(), GgufError> {
        if self.index.contains_key(key) {
            return Err(GgufError::DuplicateKey(key.to_owned()));
        }
        self.index.insert(key.to_owned(), self.entries.len());
        self.entries.push((key.to_owned(), value));
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Entries in the order they appear in the file.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Any non-negative integer.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "non-negative integer", MetaValue::as_u64)
    }

    /// An `f32`, `f64` or integer, as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "number", MetaValue::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", MetaValue::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", MetaValue::as_str)
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.typed_array(key, "array of string", MetaValue::as_str)
    }

    /// An array of integers that each fit in an `i64`.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.typed_array(key, "array of integers", MetaValue::as_i64)
    }

    /// An array of numbers, each converted as by [`MetaValue::as_f32`].
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.typed_array(key, "array of numbers", MetaValue::as_f32)
    }

    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        optional(self.get_u64(key))
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        optional(self.get_f32(key))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        optional(self.get_bool(key))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        optional(self.get_str(key))
    }

    /// Looks `key` up and converts it with `conv`, naming `expected` when the
    /// conversion fails.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<T, GgufError> {
        let value = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))?;
        conv(value).ok_or_else(|| wrong_type(key, expected, value.type_name()))
    }

    /// Like [`Self::typed`], element by element; the error names the type of
    /// the first element that did not convert.
    fn typed_array<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        conv: impl Fn(&'a MetaValue) -> Option<T>,
    ) -> Result<Vec<T>, GgufError> {
        let items = self.typed(key, expected, MetaValue::as_array)?;
        items
            .iter()
            .map(|item| {
                conv(item)
                    .ok_or_else(|| wrong_type(key, expected, MetaValue::array_type_name(item)))
            })
            .collect()
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &'static str) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        found,
    }
}

/// Turns `MissingKey` into `Ok(None)`, keeping every other outcome.
fn optional<T>(r: Result<T, GgufError>) -> Result<Option<T>, GgufError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(GgufError::MissingKey(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Metadata {
        let mut m = Metadata::new();
        m.insert("u", MetaValue::U32(7)).unwrap();
        m.insert("neg", MetaValue::I32(-3)).unwrap();
        m.insert("f", MetaValue::F64(0.5)).unwrap();
        m.insert("b", MetaValue::Bool(true)).unwrap();
        m.insert("s", MetaValue::String("hi".into())).unwrap();
        m.insert(
            "strs",
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        )
        .unwrap();
        m.insert(
            "ints",
            MetaValue::Array(vec![MetaValue::I32(-1), MetaValue::U64(2)]),
        )
        .unwrap();
        m.insert("big", MetaValue::Array(vec![MetaValue::U64(u64::MAX)]))
            .unwrap();
        m
    }

    #[test]
    fn conversions() {
        assert_eq!(MetaValue::I8(-1).as_u64(), None);
        assert_eq!(MetaValue::I64(5).as_u64(), Some(5));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U16(9).as_i64(), Some(9));
        assert_eq!(MetaValue::U32(3).as_f32(), Some(3.0));
        assert_eq!(MetaValue::U64(u64::MAX).as_f32(), Some(u64::MAX as f32));
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::String("x".into()).as_f32(), None);
        assert_eq!(MetaValue::Array(vec![]).type_name(), "array");
    }

    #[test]
    fn typed_getters() {
        let m = sample();
        assert_eq!(m.len(), 8);
        assert_eq!(m.get_u64("u").unwrap(), 7);
        assert_eq!(m.get_f32("f").unwrap(), 0.5);
        assert_eq!(m.get_f32("u").unwrap(), 7.0);
        assert!(m.get_bool("b").unwrap());
        assert_eq!(m.get_str("s").unwrap(), "hi");
        assert_eq!(m.get_str_array("strs").unwrap(), vec!["a", "b"]);
        assert_eq!(m.get_i64_array("ints").unwrap(), vec![-1, 2]);
        assert_eq!(m.opt_u64("absent").unwrap(), None);
        assert_eq!(m.opt_str("s").unwrap(), Some("hi"));
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["u", "neg", "f", "b", "s", "strs", "ints", "big"]);
    }

    #[test]
    fn typed_getter_errors() {
        let m = sample();
        assert!(matches!(m.get_u64("absent"), Err(GgufError::MissingKey(k)) if k == "absent"));
        assert!(matches!(
            m.get_u64("neg"),
            Err(GgufError::WrongType { found: "i32", .. })
        ));
        assert!(matches!(
            m.get_str("u"),
            Err(GgufError::WrongType {
                expected: "string",
                found: "u32",
                ..
            })
        ));
        assert!(matches!(
            m.opt_bool("s"),
            Err(GgufError::WrongType {
                found: "string",
                ..
            })
        ));
        assert!(matches!(
            m.get_str_array("ints"),
            Err(GgufError::WrongType {
                found: "array of i32",
                ..
            })
        ));
        assert!(matches!(
            m.get_i64_array("big"),
            Err(GgufError::WrongType {
                found: "array of u64",
                ..
            })
        ));
        assert!(matches!(
            m.get_f32_array("s"),
            Err(GgufError::WrongType {
                found: "string",
                ..
            })
        ));
    }

    #[test]
    fn duplicate_key_refused() {
        let mut m = sample();
        assert!(matches!(
            m.insert("u", MetaValue::U8(1)),
            Err(GgufError::DuplicateKey(k)) if k == "u"
        ));
        assert_eq!(m.len(), 8);
    }
}
