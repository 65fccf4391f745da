//! A logger for the `log` facade that keeps every record, for tests of what Atlas reports outside
//! return values. Install it once per process (a child's body): [`install`], then [`records`].

use std::sync::Mutex;

/// One record: its level, target and text.
pub type Record = (log::Level, String, String);

struct Kept(Mutex<Vec<Record>>);

impl log::Log for Kept {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push((
            record.level(),
            record.target().to_owned(),
            record.args().to_string(),
        ));
    }
    fn flush(&self) {}
}

static KEPT: Kept = Kept(Mutex::new(Vec::new()));

/// Makes this logger the process's, at every level. Panics when a logger is installed already.
pub fn install() {
    log::set_logger(&KEPT).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
}

/// Every record kept so far.
pub fn records() -> Vec<Record> {
    KEPT.0.lock().unwrap().clone()
}
