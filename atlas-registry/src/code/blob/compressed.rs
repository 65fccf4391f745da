//! Compressed code: the one decompressor of the crate, for the entries of fatbins (NVIDIA's LZ4
//! block format, zstd) and for compressed clang offload bundles (zstd). Blob validation checks
//! what comes out exactly as it checks code stored plain, and parameter layouts are read from it.
//!
//! Decompression is bounded by the size the container declares for what comes out: the output
//! buffer is that size (for zstd, at least that size: a buffer reused from a larger entry), a
//! stream that would write more is refused, and so is one that writes less, or has bytes left
//! over (trailing garbage is read as more of the stream, which then writes past the end or fails).
//! A declared size larger than the stream could produce at the format's highest ratio is refused
//! before anything is allocated, so a few bytes cannot make Atlas allocate gigabytes; the
//! allocation itself is fallible.
//!
//! The decoders: `lz4_flex`'s block decoder (its safe one, no unsafe code, pure Rust) and the
//! reference zstd library's one-shot decoder (`ZSTD_decompressDCtx` through `zstd-safe`; what nvcc
//! compresses with, fuzzed continuously upstream, and written to take hostile input: it writes only
//! inside the buffer it is given). Its context, about 100 KiB, is made once per thread and reused:
//! making one per entry costs a fresh allocation the size of the context, three times the time of
//! decoding a small entry. Why C and not the pure-Rust `ruzstd`: decompressing is the one cost of
//! checking compressed code that nothing can remove (every byte the driver parses is checked), and
//! measured (callgrind, release) on the four sm_90 cubins of the demo model as nvcc 13 compresses
//! them (18.6 KB), `ruzstd` 0.9 takes 1.36 M instructions and this 0.28 M; on the 16 MB sm_90
//! cubin of cuSPARSE's largest fatbin, 50 ms and 13.7 ms here. `ruzstd` has unsafe code of its
//! own (its ring buffer), so it was not the safer choice by construction either.

use std::cell::RefCell;

use super::read::{Check, Size};

/// How a payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    /// An LZ4 block (no frame), the uncompressed size known from elsewhere: fatbin flag 0x2000.
    Lz4,
    /// zstd frames (RFC 8878): fatbin flag 0x8000, compressed offload bundles.
    Zstd,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Self::Lz4 => "LZ4",
            Self::Zstd => "zstd",
        }
    }

    /// The most bytes `compressed` bytes can decompress to: LZ4 writes at most 255 bytes per
    /// input byte (a run length's extension bytes), zstd at most a 128 KiB block per 4 bytes (an
    /// RLE block's header and byte).
    fn most_from(self, compressed: usize) -> u64 {
        let compressed = compressed as u64;
        match self {
            Self::Lz4 => compressed.saturating_mul(255).saturating_add(64),
            Self::Zstd => compressed.saturating_mul(32 * 1024),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// How many streams this thread began to decompress, for tests that count them.
    pub(crate) static DECOMPRESSIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Decompresses all of `input`, compressed by `scheme`, into `out` (replacing what it held), which
/// must come out exactly `declared` bytes.
pub(super) fn decompress(scheme: Scheme, input: &[u8], declared: u64, out: &mut Vec<u8>) -> Check {
    #[cfg(test)]
    DECOMPRESSIONS.with(|n| n.set(n.get() + 1));
    out.clear();
    let name = scheme.name();
    if declared > scheme.most_from(input.len()) {
        return Err(format!(
            "it declares {} bytes uncompressed, more than {} {name}-compressed bytes can hold",
            Size(declared),
            Size(input.len() as u64)
        ));
    }
    let len = usize::try_from(declared)
        .ok()
        .filter(|&len| out.try_reserve_exact(len).is_ok())
        .ok_or_else(|| {
            format!(
                "its {} uncompressed bytes do not fit in this process's memory",
                Size(declared)
            )
        })?;
    let written = match scheme {
        Scheme::Lz4 => {
            out.resize(len, 0);
            lz4_flex::block::decompress_into(input, out).map_err(|e| e.to_string())
        }
        // Into the buffer's spare capacity, which zstd does not read: no need to zero it first.
        Scheme::Zstd => zstd(input, out),
    };
    match written {
        Ok(written) if written == len => Ok(()),
        Ok(written) => Err(format!(
            "its {} {name}-compressed bytes decompress to {} bytes, it declares {}",
            Size(input.len() as u64),
            Size(written as u64),
            Size(declared)
        )),
        Err(why) => Err(format!(
            "its {} {name}-compressed bytes do not decompress to the {} bytes it declares: {why}",
            Size(input.len() as u64),
            Size(declared)
        )),
    }
}

/// Decompresses the zstd frames of `input` into `out` (empty, its capacity reserved), whose
/// length becomes what they wrote, with this thread's decoder context.
fn zstd(input: &[u8], out: &mut Vec<u8>) -> Result<usize, String> {
    type Context = Option<zstd_safe::DCtx<'static>>;
    thread_local! {
        static CONTEXT: RefCell<Context> = const { RefCell::new(None) };
    }
    fn decode(context: &mut Context, input: &[u8], out: &mut Vec<u8>) -> Result<usize, String> {
        let context = match context {
            Some(context) => context,
            None => context.insert(
                zstd_safe::DCtx::try_create().ok_or("zstd could not allocate its context")?,
            ),
        };
        context
            .decompress(out, input)
            .map_err(|code| zstd_safe::get_error_name(code).to_string())
    }
    // A thread that is exiting, or a decode already running on this thread, gets a context of
    // its own.
    let reused = CONTEXT.try_with(|cell| {
        let mut context = cell.try_borrow_mut().ok()?;
        Some(decode(&mut context, input, out))
    });
    match reused {
        Ok(Some(result)) => result,
        _ => decode(&mut None, input, out),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// An LZ4 block of `text` as literals only: a valid block every decoder reads.
    pub(in crate::code::blob) fn lz4_literals(text: &[u8]) -> Vec<u8> {
        let mut block = Vec::new();
        let n = text.len();
        if n < 15 {
            block.push((n as u8) << 4);
        } else {
            block.push(0xf0);
            let mut rest = n - 15;
            while rest >= 255 {
                block.push(255);
                rest -= 255;
            }
            block.push(rest as u8);
        }
        block.extend_from_slice(text);
        block
    }

    #[test]
    fn streams_decompress_to_exactly_what_they_declare() {
        let text = b"the quick brown fox jumps over the lazy dog".repeat(9);
        let block = lz4_literals(&text);
        let mut out = vec![7; 3];
        decompress(Scheme::Lz4, &block, text.len() as u64, &mut out).unwrap();
        assert_eq!(out, text);
        let fewer = decompress(Scheme::Lz4, &block, text.len() as u64 + 1, &mut out);
        assert!(fewer.unwrap_err().contains("decompress to"));
        let more = decompress(Scheme::Lz4, &block, text.len() as u64 - 1, &mut out);
        assert!(more.unwrap_err().contains("do not decompress"));
        // A byte of garbage after the block.
        let trailing = [&block[..], &[0x42]].concat();
        assert!(decompress(Scheme::Lz4, &trailing, text.len() as u64, &mut out).is_err());
        // Two bytes: a match whose offset reaches before the start.
        let trailing = [&block[..], &[0x00, 0xff, 0xff]].concat();
        assert!(decompress(Scheme::Lz4, &trailing, text.len() as u64, &mut out).is_err());
    }

    #[test]
    fn declared_sizes_beyond_the_format_are_refused_before_allocating() {
        let mut out = Vec::new();
        let e = decompress(Scheme::Zstd, &[0; 10], u64::MAX, &mut out).unwrap_err();
        assert!(
            e.contains("more than 10 zstd-compressed bytes can hold"),
            "{e}"
        );
        let e = decompress(Scheme::Lz4, &[0; 10], 10 * 255 + 65, &mut out).unwrap_err();
        assert!(e.contains("more than 10 LZ4"), "{e}");
        assert_eq!(out.capacity(), 0);
        let e = decompress(Scheme::Zstd, b"not zstd at all", 15, &mut out).unwrap_err();
        assert!(e.contains("do not decompress"), "{e}");
    }
}
