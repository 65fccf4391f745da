//! Launching: the configuration ([`config`]), typed arguments ([`args`]), what Atlas knows of each
//! kernel and the one preflight that every typed launch and graph argument update passes
//! ([`kernel`]), launch attributes and their checks ([`attributes`]), the launch calls every
//! path ends in ([`enqueue`]), what a captured launch leaves its graph to keep alive
//! ([`held`]), what arguments past 4,096 bytes need ([`large_params`]), and TMA descriptors
//! passed as arguments ([`tensor_map`]).

pub(crate) mod args;
pub(crate) mod attributes;
pub(crate) mod config;
pub(crate) mod enqueue;
pub(crate) mod held;
pub(crate) mod kernel;
pub(crate) mod large_params;
pub(crate) mod tensor_map;
