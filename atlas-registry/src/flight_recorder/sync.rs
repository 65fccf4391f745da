//! The synchronization types [`ring`](super::ring) is written against: the standard library's
//! here; `loom`'s where `tests/recorder_model.rs` includes the ring to check it.

pub(crate) use std::sync::atomic;
