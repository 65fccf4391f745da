//! Compressed code: the one decompressor of the crate, for the entries of fatbins (NVIDIA's LZ4
//! block format, zstd) and for compressed clang offload bundles (zstd). Blob validation checks
//! what comes out exactly as it checks code stored plain, and parameter layouts are read from it.
//!
//! Decompression is bounded by the size the container declares for what comes out: the output
//! buffer is that size, a stream that would write more is refused, and so is one that writes
//! less, or has bytes left over (trailing garbage is read as more of the stream, which then writes
//! past the end or fails). A declared size larger than the stream could produce at the format's
//! highest ratio is refused before anything is allocated, so a few bytes cannot make Atlas
//! allocate gigabytes; the allocation itself is fallible.
//!
//! The decoders: `lz4_flex`'s block decoder (its safe one, no unsafe code) and `ruzstd`'s frame
//! decoder, both pure Rust with no dependencies of their own in the features used.

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

/// The window a zstd frame may ask for beyond the size of its content: 8 MiB, what the reference
/// compressor uses at its highest regular level (windowLog 23). Frames with a known content size
/// never need more than that size.
const ZSTD_WINDOW_SLACK: u64 = 8 << 20;

/// Decompresses all of `input`, compressed by `scheme`, into `out` (replacing what it held), which
/// must come out exactly `declared` bytes.
pub(super) fn decompress(scheme: Scheme, input: &[u8], declared: u64, out: &mut Vec<u8>) -> Check {
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
    out.resize(len, 0);
    let written = match scheme {
        Scheme::Lz4 => lz4_flex::block::decompress_into(input, out).map_err(|e| e.to_string()),
        Scheme::Zstd => {
            let mut decoder = ruzstd::decoding::FrameDecoder::new();
            decoder.set_max_window_size(declared.max(ZSTD_WINDOW_SLACK));
            decoder.decode_all(input, out).map_err(|e| e.to_string())
        }
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
