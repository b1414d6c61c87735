//! The terminal's log format (`--log-format pretty`, and `auto` on a
//! terminal): one short line per record, for a person.
//!
//! `15:04:05.123 ready uri=http://127.0.0.1:8080 vram_bytes=0  worker ready`
//!
//! The time, the event, the fields that vary, then the message. The fields
//! every record carries (worker id, model path, GPU, backend) appear once,
//! on `startup`; floats are rounded for reading (`temperature=0.7`, not
//! `0.699999988079071`); a SHA-256 shows its first 12 hex digits. The JSON
//! format is untouched by any of this.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The narration context's fields (`narrate!` adds them to every record).
const CONSTANT_FIELDS: [&str; 4] = ["worker_id", "model_ref", "gpu_device", "backend"];
/// The constants whose text another field may repeat (numbers such as the
/// GPU ordinal coincide with counts by chance).
const TEXT_CONSTANTS: [&str; 2] = ["worker_id", "model_ref"];
/// The record that shows [`CONSTANT_FIELDS`].
const SHOWS_CONSTANTS: &str = "startup";
/// Hex digits of a hash that identify it to a reader.
const HASH_DIGITS: usize = 12;

/// Formats each record as one short line; `ansi` colours the level and the
/// event.
pub struct TextFormat {
    pub ansi: bool,
}

impl<S, N> FormatEvent<S, N> for TextFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let time = chrono::Local::now().format("%H:%M:%S%.3f");
        writeln!(
            writer,
            "{time} {}",
            fields.line(*event.metadata().level(), self.ansi)
        )
    }
}

/// One record's fields, in the order they were logged.
#[derive(Default)]
struct Fields {
    event: Option<String>,
    message: Option<String>,
    pairs: Vec<(&'static str, String)>,
}

impl Fields {
    /// Everything after the time.
    fn line(&self, level: Level, ansi: bool) -> String {
        let mut out = String::new();
        let paint = |code: &str, text: &str| match ansi {
            true => format!("\x1b[{code}m{text}\x1b[0m"),
            false => text.to_string(),
        };
        match level {
            Level::ERROR => out.push_str(&paint("31", "ERROR ")),
            Level::WARN => out.push_str(&paint("33", "WARN ")),
            Level::DEBUG | Level::TRACE => out.push_str(&format!("{level} ")),
            Level::INFO => {}
        }
        let event = self.event.as_deref().unwrap_or("-");
        out.push_str(&paint("1", event));
        for (name, value) in &self.pairs {
            if event == SHOWS_CONSTANTS || !self.repeats_a_constant(name, value, level) {
                let _ = write!(out, " {name}={value}");
            }
        }
        if let Some(message) = &self.message {
            let _ = write!(out, "  {message}");
        }
        out
    }

    /// A constant field, or on an INFO (or quieter) record another field
    /// that only repeats a constant's text (`model_path` on
    /// `model_load_start`); a warning or an error keeps such a field, since it
    /// may be the first the reader sees.
    fn repeats_a_constant(&self, name: &str, value: &str, level: Level) -> bool {
        if CONSTANT_FIELDS.contains(&name) {
            return true;
        }
        let mut texts = self
            .pairs
            .iter()
            .filter(|(n, _)| TEXT_CONSTANTS.contains(n));
        level > Level::WARN && texts.any(|(_, v)| v == value)
    }

    fn push(&mut self, field: &Field, value: String) {
        match field.name() {
            "event" => self.event = Some(value),
            "message" => self.message = Some(value),
            name if name.ends_with("sha256") && value.len() > HASH_DIGITS => {
                self.pairs.push((name, value[..HASH_DIGITS].to_string()))
            }
            name => self.pairs.push((name, value)),
        }
    }
}

/// A value as a reader wants it: quoted only when it holds a space (so
/// fields stay apart) or is empty.
fn shown(text: &str) -> String {
    match text.is_empty() || text.contains(char::is_whitespace) {
        true => format!("{text:?}"),
        false => text.to_string(),
    }
}

/// At most three decimals, without trailing zeros: 0.699999988 → 0.7.
pub fn rounded(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let text = format!("{v:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    match text {
        "-0" => "0".to_string(),
        t => t.to_string(),
    }
}

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, rounded(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let value = match field.name() {
            "message" | "event" => value.to_string(),
            _ => shown(value),
        };
        self.push(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let value = match field.name() {
            "message" | "event" => text,
            _ => shown(&text),
        };
        self.push(field, value);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The lines `log` writes in the text format.
    fn lines(log: impl FnOnce()) -> Vec<String> {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(TextFormat { ansi: false })
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }

    /// What `narrate!` logs, spelled out so no other test's context shows.
    macro_rules! record {
        ($level:ident, $event:literal $(, $($rest:tt)+)?) => {
            tracing::$level!(
                event = $event,
                worker_id = "6f1d7a2e-0000-4000-8000-000000000001",
                model_ref = "/a/long/path/to/the/model.gguf",
                gpu_device = 0u64,
                backend = "cpu",
                $($($rest)+)?
            )
        };
    }

    #[test]
    fn one_short_line_per_event_with_constants_once() {
        let lines = lines(|| {
            record!(info, "startup", port = 8080u64);
            record!(
                info,
                "execute_start",
                job_id = "j1",
                temperature = 0.7f32 as f64,
                prompt_sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
                x_deadline = None::<&str>,
            );
            record!(warn, "callback_failed", url = "http://x", "no answer");
            record!(
                info,
                "model_load_start",
                model_path = "/a/long/path/to/the/model.gguf",
                upload_chunk_bytes = 4096u64,
            );
            record!(
                error,
                "error",
                model_path = "/a/long/path/to/the/model.gguf"
            );
        });
        let (time, _) = lines[0].split_once(' ').unwrap();
        assert_eq!(time.len(), "15:04:05.123".len(), "{time}");
        let want = [
            "startup worker_id=6f1d7a2e-0000-4000-8000-000000000001 \
             model_ref=/a/long/path/to/the/model.gguf gpu_device=0 backend=cpu port=8080",
            "execute_start job_id=j1 temperature=0.7 prompt_sha256=ba7816bf8f01",
            "WARN callback_failed url=http://x  no answer",
            "model_load_start upload_chunk_bytes=4096",
            "ERROR error model_path=/a/long/path/to/the/model.gguf",
        ];
        let after_time: Vec<&str> = lines.iter().map(|l| l.split_once(' ').unwrap().1).collect();
        assert_eq!(after_time, want);
    }

    #[test]
    fn floats_are_rounded_for_reading() {
        let cases = [
            (0.699999988079071, "0.7"),
            (1.0, "1"),
            (0.0, "0"),
            (-0.0001, "0"),
            (12.34567, "12.346"),
            (f64::INFINITY, "inf"),
        ];
        for (v, want) in cases {
            assert_eq!(rounded(v), want, "{v}");
        }
    }

    #[test]
    fn values_with_spaces_are_quoted() {
        assert_eq!(shown("a b"), "\"a b\"");
        assert_eq!(shown(""), "\"\"");
        assert_eq!(shown("plain"), "plain");
    }
}
