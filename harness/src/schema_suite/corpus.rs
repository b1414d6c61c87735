//! The schemas under test: one JSON Schema a file, a folder a category
//! (`testdata/schemas/<category>/<name>.json`), each with the validator its
//! outputs are checked by.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// One schema of the corpus.
pub struct Entry {
    pub category: String,
    /// The file's name without `.json`.
    pub name: String,
    pub schema: Value,
    /// The `jsonschema` crate's validator of `schema`, formats asserted.
    pub validator: jsonschema::Validator,
}

impl Entry {
    /// `category/name`, as reports and `--only` name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.category, self.name)
    }

    /// The name `response_format.json_schema.name` takes: OpenAI's
    /// `^[a-zA-Z0-9_-]{1,64}$`, from the file's name.
    pub fn format_name(&self) -> String {
        let mut name: String = self
            .name
            .chars()
            .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
                true => c,
                false => '_',
            })
            .take(64)
            .collect();
        if name.is_empty() {
            name.push('_');
        }
        name
    }

    /// A short user prompt asking for an instance, naming the schema by its
    /// title (else the file's name) and the start of its description: the
    /// schema itself stays out of the prompt (the grammar enforces it), so
    /// the prompt is short on every model.
    pub fn prompt(&self) -> String {
        let text = |key: &str| self.schema.get(key).and_then(Value::as_str);
        let title = text("title").unwrap_or(&self.name);
        let mut prompt = format!("Write one example JSON value for the schema \"{title}\".");
        if let Some(d) = text("description").filter(|d| !d.trim().is_empty()) {
            let d: String = d.chars().take(200).collect();
            prompt.push_str(&format!(" It describes: {}", d.trim()));
        }
        prompt
    }
}

/// Which schemas of the corpus to run.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Keep the schemas whose `category/name` contains one of these (none: all).
    pub only: Vec<String>,
    /// At most this many schemas of each category, in name order.
    pub per_category: Option<usize>,
}

impl Filter {
    fn keeps(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| id.contains(o.as_str()))
    }
}

/// The corpus under `root`, categories and files in name order. A file that
/// is not JSON, or that the validator cannot compile, fails the load: the
/// suite could not check its outputs.
pub fn load(root: &Path, filter: &Filter) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for dir in sorted(root)?.into_iter().filter(|p| p.is_dir()) {
        let category = file_name(&dir)?;
        let mut kept = 0;
        for path in sorted(&dir)? {
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let name = file_name(&path)?.trim_end_matches(".json").to_string();
            if !filter.keeps(&format!("{category}/{name}"))
                || filter.per_category.is_some_and(|n| kept >= n)
            {
                continue;
            }
            entries.push(entry(category.clone(), name, path)?);
            kept += 1;
        }
    }
    if entries.is_empty() {
        bail!("no schema selected under {}", root.display());
    }
    Ok(entries)
}

fn entry(category: String, name: String, path: PathBuf) -> Result<Entry> {
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let schema: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let validator = validator(&schema).with_context(|| format!("{}", path.display()))?;
    Ok(Entry {
        category,
        name,
        schema,
        validator,
    })
}

/// A validator that also asserts `format` (an annotation only by default
/// since draft 2019-09): the worker enforces formats, so outputs are held to
/// them.
pub fn validator(schema: &Value) -> Result<jsonschema::Validator> {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| anyhow!("the validator cannot compile the schema: {e}"))
}

fn sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?;
    paths.sort();
    Ok(paths)
}

fn file_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| anyhow!("{} has no UTF-8 name", path.display()))
}
