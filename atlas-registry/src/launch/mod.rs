//! Launching: the configuration ([`config`]), typed arguments ([`args`]), what Atlas knows of each
//! kernel and the one preflight that every typed launch and graph argument update passes
//! ([`kernel`]), launch attributes and their checks ([`attributes`]), and the launch calls every
//! path ends in ([`enqueue`]).

pub(crate) mod args;
pub(crate) mod attributes;
pub(crate) mod config;
pub(crate) mod enqueue;
pub(crate) mod kernel;
