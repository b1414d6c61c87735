//! Per-render limits on time and on the bytes a template creates (a
//! worker-orcd patch; see `third_party/README.md`).
//!
//! Fuel counts instructions, but one instruction can double a string
//! (`{% set x = x ~ x %}`), repeat it, or call a filter whose output is the
//! square of its input (`replace`, `join`), so fuel alone bounds neither
//! memory nor time. A render with limits charges every value an instruction
//! creates, and every byte it writes, against a byte budget; operations whose
//! output can outgrow their inputs check the projected size before they
//! allocate; and the instruction loop checks a deadline.
//!
//! The budget lives in a thread-local for the duration of the outermost
//! render on the thread, so value operations deep inside the engine can
//! charge it without a `State` at hand.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::value::{ObjectRepr, Value, ValueRepr};

/// Bytes charged per item of a sequence or map: about the size of a `Value`
/// plus its share of the container.
const BYTES_PER_ITEM: usize = 32;
/// The deadline is read once every this many instructions.
const TICKS_PER_CLOCK_READ: u32 = 8;
/// Bytes charged per number, boolean or none: about its longest rendering.
const SCALAR_BYTES: usize = 24;

/// Limits for one render; set on the environment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenderLimits {
    /// Wall-clock time for one render.
    pub time: Option<Duration>,
    /// Bytes of values created and output written during one render.
    pub bytes: Option<usize>,
}

#[derive(Clone, Copy)]
struct Budget {
    deadline: Option<Instant>,
    bytes_left: usize,
    ticks: u32,
}

thread_local! {
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// Holds the budget of the outermost render; clears it when dropped.
pub(crate) struct Guard {
    installed: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.installed {
            BUDGET.with(|b| b.set(None));
        }
    }
}

/// Starts a budget unless a render on this thread already has one (nested
/// renders share the outer budget).
pub(crate) fn install(limits: RenderLimits) -> Guard {
    if limits == RenderLimits::default() || BUDGET.with(|b| b.get().is_some()) {
        return Guard { installed: false };
    }
    let budget = Budget {
        deadline: limits.time.map(|t| Instant::now() + t),
        bytes_left: limits.bytes.unwrap_or(usize::MAX),
        ticks: 0,
    };
    BUDGET.with(|b| b.set(Some(budget)));
    Guard { installed: true }
}

fn out_of_memory(bytes: usize) -> Error {
    Error::new(
        ErrorKind::OutOfFuel,
        format!("template rendering would exceed its memory budget (asked for {bytes} more bytes)"),
    )
}

/// Fails if `bytes` more would not fit in the budget; charges nothing. For
/// operations to call before they allocate an output of that size.
pub fn ensure(bytes: usize) -> Result<(), Error> {
    match BUDGET.with(|b| b.get()) {
        Some(budget) if bytes > budget.bytes_left => Err(out_of_memory(bytes)),
        _ => Ok(()),
    }
}

/// Takes `bytes` from the budget.
pub fn charge(bytes: usize) -> Result<(), Error> {
    BUDGET.with(|b| match b.get() {
        None => Ok(()),
        Some(mut budget) => {
            if bytes > budget.bytes_left {
                return Err(out_of_memory(bytes));
            }
            budget.bytes_left -= bytes;
            b.set(Some(budget));
            Ok(())
        }
    })
}

/// Charges a value just created by an instruction.
pub(crate) fn charge_value(value: &Value) -> Result<(), Error> {
    let Some(budget) = BUDGET.with(|b| b.get()) else {
        return Ok(());
    };
    if !matches!(
        value.0,
        ValueRepr::String(..) | ValueRepr::SmallStr(_) | ValueRepr::Bytes(_) | ValueRepr::Object(_)
    ) {
        // A number or the like: no allocation worth counting.
        return Ok(());
    }
    let bytes = ok!(size_within(value, budget.bytes_left));
    charge(bytes)
}

/// Fails unless `n` copies of `value` fit in the budget; charges nothing.
pub fn ensure_copies(value: &Value, n: usize) -> Result<(), Error> {
    let Some(budget) = BUDGET.with(|b| b.get()) else {
        return Ok(());
    };
    let one = ok!(size_within(value, budget.bytes_left));
    ensure(one.saturating_mul(n))
}

/// Fails unless `n` values (items of a sequence being built) fit.
pub fn ensure_items(n: usize) -> Result<(), Error> {
    ensure(n.saturating_mul(BYTES_PER_ITEM))
}

/// Fails unless `s` with every `from` replaced by `to` fits: the output is
/// the square of the input when `from` is empty (it matches between every
/// character) and `to` is long.
pub fn ensure_replaced(s: &str, from: &str, to: &str) -> Result<(), Error> {
    let hits = s.matches(from).count();
    ensure(hits.saturating_mul(to.len()).saturating_add(s.len()))
}

/// Fails unless the items of `seq` joined by `joiner` fit: the joiner is
/// written once per item.
pub fn ensure_joined(seq: &Value, joiner: &str) -> Result<(), Error> {
    ok!(ensure_copies(seq, 1));
    ensure(seq.len().unwrap_or(0).saturating_mul(joiner.len()))
}

/// About how many bytes `value` would take if written out or materialised:
/// string and byte lengths, a fixed size per scalar and per item of a
/// sequence or map, lazy ones included, items shared with other values
/// counted in full. Stops with an error past `cap` bytes or
/// [`MAX_DEPTH`] levels of nesting, so it is cheap on hostile values.
pub fn size_within(value: &Value, cap: usize) -> Result<usize, Error> {
    let mut total = 0;
    ok!(add_size(value, 0, &mut total, cap));
    Ok(total)
}

/// Values nested deeper than this are refused (formatting and dropping them
/// recurse).
const MAX_DEPTH: usize = 64;

fn add_size(value: &Value, depth: usize, total: &mut usize, cap: usize) -> Result<(), Error> {
    let mut add = |n: usize| {
        *total = total.saturating_add(n);
        if *total > cap {
            Err(out_of_memory(*total))
        } else {
            Ok(())
        }
    };
    match value.0 {
        ValueRepr::String(ref s, _) => add(s.len()),
        ValueRepr::SmallStr(ref s) => add(s.as_str().len()),
        ValueRepr::Bytes(ref b) => add(b.len()),
        ValueRepr::Object(ref obj) => {
            ok!(add(BYTES_PER_ITEM));
            let repr = obj.repr();
            if repr == ObjectRepr::Plain {
                return Ok(());
            }
            if depth >= MAX_DEPTH {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("value nested more than {MAX_DEPTH} levels deep"),
                ));
            }
            let Some(items) = obj.try_iter() else {
                return Ok(());
            };
            for (i, item) in items.enumerate() {
                if i % 4096 == 4095 {
                    // Sizing a long lazy sequence is itself work.
                    ok!(check_deadline());
                }
                *total = total.saturating_add(BYTES_PER_ITEM);
                ok!(add_size(&item, depth + 1, total, cap));
                if repr == ObjectRepr::Map {
                    if let Some(v) = obj.get_value(&item) {
                        ok!(add_size(&v, depth + 1, total, cap));
                    }
                }
            }
            Ok(())
        }
        _ => add(SCALAR_BYTES),
    }
}

fn past_time_limit() -> Error {
    Error::new(
        ErrorKind::OutOfFuel,
        "template rendering ran past its time limit",
    )
}

/// Fails if the render's deadline has passed.
fn check_deadline() -> Result<(), Error> {
    match BUDGET.with(|b| b.get()).and_then(|b| b.deadline) {
        Some(deadline) if Instant::now() > deadline => Err(past_time_limit()),
        _ => Ok(()),
    }
}

/// Called once per instruction: fails once the deadline has passed.
pub(crate) fn tick() -> Result<(), Error> {
    BUDGET.with(|b| {
        let Some(mut budget) = b.get() else {
            return Ok(());
        };
        let Some(deadline) = budget.deadline else {
            return Ok(());
        };
        budget.ticks += 1;
        if budget.ticks >= TICKS_PER_CLOCK_READ {
            budget.ticks = 0;
            if Instant::now() > deadline {
                return Err(past_time_limit());
            }
        }
        b.set(Some(budget));
        Ok(())
    })
}
