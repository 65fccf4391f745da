//! What Atlas reports outside a return value, through the [`log`] facade: a cleanup that failed
//! in a `Drop`, a stream kept because its capture was forgotten with streams forked into it, a
//! host function that panicked, a compile cache that could not be used (and, straight through
//! the facade, the flight recorder's lost contexts). An engine's logger
//! decides where each goes; the records' target is the module that made them
//! (`atlas_registry::...`).
//!
//! Without a logger (the facade's maximum level is `Off`, as it is until one is installed), the
//! reports Atlas has always printed to stderr, one line each, still are: failed cleanups and kept
//! streams, which may come at exit when nothing else can say them. Nothing else is printed.

use std::fmt;

/// Whether a report also goes to stderr when no logger is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WithoutLogger {
    /// One line on stderr, `atlas: ...`.
    Stderr,
    /// Nothing.
    Silent,
}

/// Reports `message` at `level` from `module` (the target), to the installed logger, or as
/// `without` says when none is.
pub(crate) fn report(
    level: log::Level,
    module: &'static str,
    message: fmt::Arguments<'_>,
    without: WithoutLogger,
) {
    if log::max_level() == log::LevelFilter::Off {
        if without == WithoutLogger::Stderr {
            eprintln!("atlas: {message}");
        }
        return;
    }
    log::log!(target: module, level, "{message}");
}
