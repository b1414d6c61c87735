//! Why a serve-mode configuration is refused: a required flag missing (a
//! usage error) or a value failing its check.

/// A configuration the worker will not start with.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Required flags are missing everywhere: a usage error (exit 2), naming
    /// all of them at once.
    #[error("{}", missing_message(.0))]
    Missing(Vec<&'static str>),
    /// A value failed its check (exit 1).
    #[error("{flag}: {message}")]
    Invalid { flag: &'static str, message: String },
}

fn missing_message(flags: &[&'static str]) -> String {
    let (last, rest) = flags.split_last().unwrap_or((&"", &[]));
    let names = match rest {
        [] => format!("the flag {last} is"),
        _ => format!("the flags {} and {last} are", rest.join(", ")),
    };
    format!(
        "{names} required (on the command line or in --config); to start the worker by hand, \
         run `worker-orcd serve MODEL.gguf` (see `worker-orcd serve --help`)"
    )
}

pub(crate) fn invalid(flag: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        flag,
        message: message.into(),
    }
}
