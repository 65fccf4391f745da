//! Launching: the configuration ([`config`]), typed arguments ([`args`]), what Atlas knows of each
//! kernel and the one preflight that every typed launch and graph argument update passes
//! ([`kernel`]), and the launch call every path ends in ([`enqueue`]).

pub(crate) mod args;
pub(crate) mod config;
pub(crate) mod enqueue;
pub(crate) mod kernel;
