//! [`LaunchConfig`]: grid, block and dynamic shared memory of a launch, and its check against the
//! device's [`DeviceLimits`].

use crate::device::limits::DeviceLimits;
use crate::error::LimitError;

/// Grid, block and dynamic shared memory of a launch.
///
/// ```
/// use atlas_registry::LaunchConfig;
///
/// let cfg = LaunchConfig::for_elements(1000, 256); // one thread per element
/// assert_eq!((cfg.grid, cfg.block, cfg.shared_mem_bytes), ((4, 1, 1), (256, 1, 1), 0));
/// let staged = cfg.with_shared_mem(96 << 10); // 96 KiB: Atlas makes the opt-in at launch
/// assert_eq!(staged.shared_mem_bytes, 98_304);
/// let tiles = LaunchConfig { grid: (8, 8, 1), block: (16, 16, 1), shared_mem_bytes: 0 };
/// # let _ = tiles;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes. Above 48 KiB, Atlas makes the per-function opt-in
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) once per function and size.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch covering `n` elements with `block` threads per block
    /// (`ceil(n / block)` blocks, at least one), no dynamic shared memory.
    pub fn for_elements(n: u32, block: u32) -> Self {
        let block = block.max(1);
        Self {
            grid: (n.div_ceil(block).max(1), 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The same configuration with `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(self, bytes: u32) -> Self {
        Self {
            shared_mem_bytes: bytes,
            ..self
        }
    }
}

impl DeviceLimits {
    /// `Ok` when `cfg` fits the device, else which limit it breaks.
    ///
    /// Every limit is compared at once, without a branch per comparison (`x - 1 >= max`, wrapping,
    /// is `x == 0 || x > max`); only a configuration that breaks one is looked at limit by limit,
    /// to name it.
    #[inline]
    pub fn check(&self, cfg: &LaunchConfig) -> Result<(), LimitError> {
        if self.fits(cfg) {
            return Ok(());
        }
        self.broken_limit(cfg)
    }

    /// Whether `cfg` fits every limit: what [`check`](Self::check) says, without naming the
    /// limit, every comparison made at once without a branch.
    #[inline]
    pub(crate) fn fits(&self, cfg: &LaunchConfig) -> bool {
        let (grid, block, mg, mb) = (cfg.grid, cfg.block, self.max_grid, self.max_block);
        let outside = |x: u32, max: u32| x.wrapping_sub(1) >= max;
        // Wrapping: past the block limits (checked beside it) the product means nothing.
        let threads = (u64::from(block.0) * u64::from(block.1)).wrapping_mul(u64::from(block.2));
        !(outside(grid.0, mg.0)
            | outside(grid.1, mg.1)
            | outside(grid.2, mg.2)
            | outside(block.0, mb.0)
            | outside(block.1, mb.1)
            | outside(block.2, mb.2)
            | (threads > u64::from(self.max_threads_per_block))
            | (cfg.shared_mem_bytes > self.max_shared_mem_optin))
    }

    /// Which limit `cfg` breaks, in the order a reader checks them: zero sizes, block
    /// dimensions, threads per block, grid dimensions, shared memory.
    #[cold]
    #[inline(never)]
    fn broken_limit(&self, cfg: &LaunchConfig) -> Result<(), LimitError> {
        let (grid, block) = (cfg.grid, cfg.block);
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Err(LimitError::ZeroGrid(grid));
        }
        if block.0 == 0 || block.1 == 0 || block.2 == 0 {
            return Err(LimitError::ZeroBlock(block));
        }
        let (mb, mg) = (self.max_block, self.max_grid);
        if block.0 > mb.0 || block.1 > mb.1 || block.2 > mb.2 {
            return Err(LimitError::BlockDimensions { block, max: mb });
        }
        let threads = u64::from(block.0) * u64::from(block.1) * u64::from(block.2);
        if threads > u64::from(self.max_threads_per_block) {
            return Err(LimitError::BlockThreads {
                block,
                threads,
                max: self.max_threads_per_block,
            });
        }
        if grid.0 > mg.0 || grid.1 > mg.1 || grid.2 > mg.2 {
            return Err(LimitError::GridDimensions { grid, max: mg });
        }
        if cfg.shared_mem_bytes > self.max_shared_mem_optin {
            return Err(LimitError::SharedMemory {
                bytes: cfg.shared_mem_bytes,
                max: self.max_shared_mem_optin,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn for_elements_covers_n() {
        assert_eq!(LaunchConfig::for_elements(1000, 256).grid, (4, 1, 1));
        assert_eq!(LaunchConfig::for_elements(1024, 256).grid, (4, 1, 1));
        assert_eq!(LaunchConfig::for_elements(0, 256).grid, (1, 1, 1));
        assert_eq!(LaunchConfig::for_elements(5, 0).block, (1, 1, 1));
    }

    fn h200() -> DeviceLimits {
        DeviceLimits {
            max_threads_per_block: 1024,
            max_block: (1024, 1024, 64),
            max_grid: (i32::MAX as u32, 65535, 65535),
            max_shared_mem_optin: 232_448,
            multiprocessors: 132,
            cluster_launch: true,
            cooperative_launch: true,
        }
    }

    #[test]
    fn limits_name_the_limit_broken() {
        let l = h200();
        let ok = LaunchConfig::for_elements(1 << 20, 256);
        assert_eq!(l.check(&ok), Ok(()));
        let check = |cfg: LaunchConfig| l.check(&cfg).unwrap_err();
        assert_eq!(
            check(LaunchConfig {
                block: (2048, 1, 1),
                ..ok
            }),
            LimitError::BlockDimensions {
                block: (2048, 1, 1),
                max: (1024, 1024, 64)
            }
        );
        let threads = check(LaunchConfig {
            block: (32, 32, 2),
            ..ok
        });
        assert_eq!(
            threads,
            LimitError::BlockThreads {
                block: (32, 32, 2),
                threads: 2048,
                max: 1024
            }
        );
        assert!(threads.to_string().contains("2048 threads"), "{threads}");
        assert_eq!(
            check(LaunchConfig {
                grid: (0, 1, 1),
                ..ok
            }),
            LimitError::ZeroGrid((0, 1, 1))
        );
        assert_eq!(
            check(LaunchConfig {
                block: (1, 0, 1),
                ..ok
            }),
            LimitError::ZeroBlock((1, 0, 1))
        );
        assert!(matches!(
            check(LaunchConfig {
                grid: (1, 70000, 1),
                ..ok
            }),
            LimitError::GridDimensions { .. }
        ));
        let big = check(ok.with_shared_mem(232_449));
        assert_eq!(
            big,
            LimitError::SharedMemory {
                bytes: 232_449,
                max: 232_448
            }
        );
        assert!(big.to_string().contains("232449 B"), "{big}");
        assert_eq!(l.check(&ok.with_shared_mem(96 * 1024)), Ok(()));
    }

    /// Launch dimensions, edges included.
    fn dim() -> impl Strategy<Value = u32> {
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(64),
            Just(1024),
            Just(1025),
            Just(65535),
            Just(65536),
            1..=4096u32,
            any::<u32>(),
        ]
    }

    /// A configuration no larger than `cfg` in any dimension (every dimension at least 1), with
    /// no more shared memory.
    fn smaller(cfg: LaunchConfig, picks: [u32; 7]) -> LaunchConfig {
        let shrink = |d: u32, pick: u32| 1 + pick % d.max(1);
        LaunchConfig {
            grid: (
                shrink(cfg.grid.0, picks[0]),
                shrink(cfg.grid.1, picks[1]),
                shrink(cfg.grid.2, picks[2]),
            ),
            block: (
                shrink(cfg.block.0, picks[3]),
                shrink(cfg.block.1, picks[4]),
                shrink(cfg.block.2, picks[5]),
            ),
            shared_mem_bytes: picks[6] % cfg.shared_mem_bytes.saturating_add(1),
        }
    }

    proptest! {
        /// The branch-free check agrees with the limit-by-limit one, which names the limit, on
        /// every configuration: both accept the same ones.
        #[test]
        fn the_fast_check_agrees_with_the_limit_by_limit_one(
            grid in (dim(), dim(), dim()),
            block in (dim(), dim(), dim()),
            shared_mem_bytes in prop_oneof![Just(0u32), Just(232_448), Just(232_449), any::<u32>()],
        ) {
            let l = h200();
            let cfg = LaunchConfig { grid, block, shared_mem_bytes };
            prop_assert_eq!(l.check(&cfg), l.broken_limit(&cfg));
        }

        /// Properties that hold whatever the check's code: it never panics; a legal launch stays
        /// legal when made smaller in any dimension; a dimension of 0 is always refused; and each
        /// refusal names a limit that the configuration really breaks.
        #[test]
        fn the_check_is_monotone_and_names_a_real_limit(
            grid in (dim(), dim(), dim()),
            block in (dim(), dim(), dim()),
            shared_mem_bytes in prop_oneof![Just(0u32), Just(48 * 1024), Just(232_448), Just(232_449), any::<u32>()],
            picks in any::<[u32; 7]>(),
        ) {
            let l = h200();
            let cfg = LaunchConfig { grid, block, shared_mem_bytes };
            match l.check(&cfg) {
                Ok(()) => prop_assert_eq!(l.check(&smaller(cfg, picks)), Ok(())),
                Err(LimitError::ZeroGrid(g)) => prop_assert!(g == grid && [g.0, g.1, g.2].contains(&0)),
                Err(LimitError::ZeroBlock(b)) => prop_assert!(b == block && [b.0, b.1, b.2].contains(&0)),
                Err(LimitError::BlockDimensions { block: b, max }) => {
                    prop_assert!(b.0 > max.0 || b.1 > max.1 || b.2 > max.2)
                }
                Err(LimitError::BlockThreads { threads, max, .. }) => {
                    prop_assert!(threads > u64::from(max));
                    prop_assert_eq!(threads, u64::from(block.0) * u64::from(block.1) * u64::from(block.2));
                }
                Err(LimitError::GridDimensions { grid: g, max }) => {
                    prop_assert!(g.0 > max.0 || g.1 > max.1 || g.2 > max.2)
                }
                Err(LimitError::SharedMemory { bytes, max }) => prop_assert!(bytes > max),
            }
            if [grid.0, grid.1, grid.2, block.0, block.1, block.2].contains(&0) {
                prop_assert!(l.check(&cfg).is_err());
            }
        }
    }
}
