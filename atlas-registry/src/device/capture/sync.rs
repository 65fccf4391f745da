//! The synchronization types [`record`](super::record) is written against: the standard
//! library's here; `loom`'s where `tests/capture_model.rs` includes the record to check it.

pub(crate) use std::sync::{Condvar, Mutex, MutexGuard, atomic};
pub(crate) use std::thread;
