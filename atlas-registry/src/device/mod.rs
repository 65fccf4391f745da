//! The devices as the process uses them: one [`host`](host::host) per device (its primary
//! context, one stream, its limits), what a device is and has (identity, memory, attributes),
//! binding Atlas's context on the calling thread, streams, green contexts (streams on a share of
//! a device's multiprocessors), and Atlas's record of the captures it began.

pub(crate) mod capture;
pub(crate) mod context;
pub(crate) mod context_limit;
pub(crate) mod event;
pub(crate) mod green_context;
pub(crate) mod host;
pub(crate) mod host_function;
pub(crate) mod info;
pub(crate) mod limits;
pub(crate) mod stream;
