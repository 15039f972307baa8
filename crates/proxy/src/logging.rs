//! Logging with `tracing`: a default level, per-category levels (by target
//! prefix), an optional rotating file, source locations on demand, and the
//! HSCALE_LOG environment variable that overrides the file's filter.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_appender::rolling::{RollingFileAppender, Rotation as Rolling};
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, Rotation};

/// The filter directive the configuration describes: `info,hscale::exec=debug`.
pub fn filter_directive(config: &LogConfig) -> String {
    let mut directive = config.level.clone();
    for (category, level) in &config.categories {
        directive.push_str(&format!(",{category}={level}"));
    }
    directive
}

/// Installs the global subscriber; keep the guard alive while logging.
pub fn init(config: &LogConfig) -> Option<WorkerGuard> {
    let filter = std::env::var("HSCALE_LOG")
        .ok()
        .and_then(|env| EnvFilter::try_new(env).ok())
        .unwrap_or_else(|| EnvFilter::new(filter_directive(config)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_file(config.source)
        .with_line_number(config.source);
    match &config.file {
        None => {
            // Colour only for a person at a terminal: stderr sent to a file
            // or a pipe gets plain text.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let _ = builder
                .with_ansi(ansi)
                .with_writer(std::io::stderr)
                .try_init();
            None
        }
        Some(path) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "hscale.log".into());
            let rotation = match config.rotation {
                Rotation::Never => Rolling::NEVER,
                Rotation::Hourly => Rolling::HOURLY,
                Rotation::Daily => Rolling::DAILY,
            };
            let (writer, guard) =
                tracing_appender::non_blocking(RollingFileAppender::new(rotation, dir, name));
            let _ = builder.with_ansi(false).with_writer(writer).try_init();
            Some(guard)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_become_per_target_directives() {
        let mut config = LogConfig::default();
        config
            .categories
            .insert("hscale::session".into(), "debug".into());
        config
            .categories
            .insert("hscale::backend".into(), "trace".into());
        let directive = filter_directive(&config);
        assert_eq!(
            directive,
            "info,hscale::backend=trace,hscale::session=debug"
        );
        assert!(EnvFilter::try_new(directive).is_ok());
    }
}
