//! A kernel that keeps the device busy for a given number of clock cycles, written in PTX so that
//! any GPU from sm_75 and any CUDA 12 driver loads it: `spin(unsigned long long cycles)`.

use atlas_registry::AtlasRegistry;

/// `spin(u64 cycles)`: every thread reads `%clock64` until `cycles` have passed.
pub const SPIN_PTX: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .entry spin(.param .u64 cycles)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [cycles];
    mov.u64 %rd2, %clock64;
LOOP:
    mov.u64 %rd3, %clock64;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra LOOP;
    ret;
}
"#;

/// A registry of device `ordinal` holding the module `spin`.
pub fn spin_registry(ordinal: usize) -> AtlasRegistry {
    AtlasRegistry::load(ordinal, &[("spin", SPIN_PTX.as_bytes())]).expect("the spin kernel loads")
}
