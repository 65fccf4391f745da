//! Compressed code: the one decompressor of the crate, for the entries of fatbins (NVIDIA's LZ4
//! block format, zstd) and for compressed clang offload bundles (zstd). Blob validation checks
//! what comes out exactly as it checks code stored plain, and parameter layouts are read from it.
//!
//! Decompression is bounded by the size the container declares for what comes out: the output
//! buffer is that size (for zstd, at least that size: a buffer reused from a larger entry), a
//! stream that would write more is refused, and so is one that writes less, or has bytes left
//! over (trailing garbage is read as more of the stream, which then writes past the end or fails).
//!
//! What that size may make Atlas allocate is bounded three ways, each before anything is
//! allocated:
//!
//! - the format's highest ratio: a declared size larger than the stream could produce is refused
//!   (zstd writes at most 32,768 bytes per input byte, LZ4 255).
//! - [`UNCOMPRESSED_LIMIT`]: no piece is decompressed to more than 256 MiB. The largest in
//!   NVIDIA's CUDA 12 and 13 libraries is a 60 MB PTX entry of cuBLASLt 13 (its largest cubin,
//!   28.6 MB); the limit is four times that. A piece past it is refused as
//!   [`AtlasError::TooLargeToCheck`](crate::AtlasError::TooLargeToCheck), naming it.
//! - for a cubin (a fatbin's ELF entry), its own headers: a cubin of more than 1 MiB is first
//!   decompressed only as far as its ELF header and header tables reach (its first 64 bytes, then,
//!   where the tables end before the declared size, up to their end), and a declared size past
//!   the end of everything its headers describe ([`extent`]) is refused before the rest is
//!   allocated. So the cheapest way to make zstd write gigabytes, code followed by zeros, costs the
//!   code. Smaller cubins are decompressed whole first (a start decompressed twice would cost more
//!   than the megabyte saved) and then refused the same way. Real cubins end exactly where they
//!   declare.
//!
//! A piece within the limit whose headers describe it all (PTX says nothing of its length but
//! where its NUL is) costs what it declares, once: one buffer serves every piece of a blob, and a
//! buffer too small for the next is freed before the next is allocated, so one validation holds
//! at most [`UNCOMPRESSED_LIMIT`] bytes of decompressed code at a time. To find how far a cubin's
//! headers reach, zstd's streaming decoder sets aside a window (at most the declared size, and at
//! most the limit) of which it writes only what it decodes, a block or so past the headers.
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

use super::elf::extent::{Extent, extent};
use super::read::{Check, Refusal, Refused, Size};

/// The most bytes a compressed piece of a blob (a fatbin entry, a compressed offload bundle) may
/// declare uncompressed: 256 MiB, four times the largest entry of NVIDIA's CUDA 12 and 13
/// libraries (a 60 MB PTX entry of cuBLASLt 13). A piece that declares more is refused with
/// [`AtlasError::TooLargeToCheck`](crate::AtlasError::TooLargeToCheck) before anything is
/// decompressed; one validation holds at most this many bytes of decompressed code at a time
/// (see [`validate_blob`](super::validate_blob)).
pub const UNCOMPRESSED_LIMIT: u64 = 1 << LIMIT_LOG;
const LIMIT_LOG: u32 = 28;

/// A cubin larger than this is decompressed as far as its headers first ([`probe`]).
const PROBED_ABOVE: u64 = 1 << 20;

/// How a payload is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    /// An LZ4 block (no frame), the uncompressed size known from elsewhere: fatbin flag 0x2000.
    Lz4,
    /// zstd frames (RFC 8878): fatbin flag 0x8000, compressed offload bundles.
    Zstd,
}

/// What a payload holds, as far as its length goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// A cubin, whose headers say how long it is ([`extent`]).
    Cubin,
    /// Anything else (PTX, an offload bundle).
    Other,
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
/// must come out exactly `declared` bytes, of which `holds` tells how long they may be.
pub(super) fn decompress(
    scheme: Scheme,
    input: &[u8],
    declared: u64,
    holds: Holds,
    out: &mut Vec<u8>,
) -> Refused {
    #[cfg(test)]
    DECOMPRESSIONS.with(|n| n.set(n.get() + 1));
    out.clear();
    let name = scheme.name();
    if declared > scheme.most_from(input.len()) {
        return Err(format!(
            "it declares {} bytes uncompressed, more than {} {name}-compressed bytes can hold",
            Size(declared),
            Size(input.len() as u64)
        )
        .into());
    }
    if declared > UNCOMPRESSED_LIMIT {
        return Err(Refusal::TooLarge {
            what: String::new(),
            declared,
        });
    }
    if holds == Holds::Cubin && declared > PROBED_ABOVE {
        probe(scheme, input, declared, out)?;
    }
    // Within the limit, so a `usize` on every target that can hold it.
    let len = usize::try_from(declared).unwrap_or(usize::MAX);
    make_room(out, len)?;
    let written = match scheme {
        Scheme::Lz4 => {
            out.resize(len, 0);
            lz4_flex::block::decompress_into(input, out).map_err(|e| e.to_string())
        }
        // Into the buffer's spare capacity, which zstd does not read: no need to zero it first.
        Scheme::Zstd => zstd(input, out),
    };
    match written {
        Ok(written) if written == len => {}
        Ok(written) => return Err(fewer(scheme, input, written as u64, declared).into()),
        Err(why) => {
            return Err(format!(
                "its {} {name}-compressed bytes do not decompress to the {} bytes it declares: \
                 {why}",
                Size(input.len() as u64),
                Size(declared)
            )
            .into());
        }
    }
    if holds == Holds::Cubin
        && let Extent::Ends(end) = extent(out)
        && declared > end
    {
        return Err(past_end(declared, end).into());
    }
    Ok(())
}

/// Decompresses as much of the start of the cubin `input` holds as its headers need to say how
/// long it is ([`extent`]) into `out`: its first 64 bytes, then, where its header tables end
/// before `declared`, up to their end. Refuses `declared` past the end of what its headers
/// describe, or a start that is not a cubin's.
#[cold]
fn probe(scheme: Scheme, input: &[u8], declared: u64, out: &mut Vec<u8>) -> Check {
    let mut want = 64;
    loop {
        prefix(scheme, input, want, out).map_err(|why| {
            format!(
                "its first {} bytes do not decompress from its {} {}-compressed bytes: {why}",
                Size(want),
                Size(input.len() as u64),
                scheme.name()
            )
        })?;
        let got = out.len() as u64;
        match extent(out) {
            Extent::Ends(end) if declared > end => return Err(past_end(declared, end)),
            Extent::Ends(_) => return Ok(()),
            // The tables reach the declared size (or past it: the ELF check refuses that).
            Extent::Needs(end) if end >= declared => return Ok(()),
            Extent::Needs(_) if got < want => return Err(fewer(scheme, input, got, declared)),
            Extent::Needs(end) => want = end,
            Extent::Unreadable => {
                return Err(format!(
                    "it declares {} bytes uncompressed, and its first bytes are not the header \
                     of a 64-bit little-endian ELF file, which would say how long it is",
                    Size(declared)
                ));
            }
        }
    }
}

/// Replaces what `out` holds with the first `want` bytes that `input`, compressed by `scheme`,
/// decompresses to (all of them, when there are fewer).
fn prefix(scheme: Scheme, input: &[u8], want: u64, out: &mut Vec<u8>) -> Result<(), String> {
    out.clear();
    let want = usize::try_from(want).unwrap_or(usize::MAX);
    make_room(out, want)?;
    match scheme {
        Scheme::Lz4 => lz4_prefix(input, want, out),
        Scheme::Zstd => zstd_prefix(input, want, out),
    }
}

/// Makes room in `out` (empty) for `len` bytes; a smaller allocation is freed first, so that the
/// old and the new one are never held at once.
fn make_room(out: &mut Vec<u8>, len: usize) -> Check {
    if out.capacity() < len {
        *out = Vec::new();
    }
    out.try_reserve_exact(len).map_err(|_| {
        format!(
            "its {} uncompressed bytes do not fit in this process's memory",
            Size(len as u64)
        )
    })
}

/// The refusal of a cubin that declares `declared` bytes, whose headers describe `end`.
#[cold]
fn past_end(declared: u64, end: u64) -> String {
    format!(
        "it declares {} bytes uncompressed, and the cubin's headers describe {} (where its \
         header tables, sections and segments end): the rest would be decompressed for nothing",
        Size(declared),
        Size(end)
    )
}

/// The refusal of `input`, compressed by `scheme`, that decompresses to `written` bytes only.
#[cold]
fn fewer(scheme: Scheme, input: &[u8], written: u64, declared: u64) -> String {
    format!(
        "its {} {}-compressed bytes decompress to {} bytes, it declares {}",
        Size(input.len() as u64),
        scheme.name(),
        Size(written),
        Size(declared)
    )
}

/// The first `want` bytes of the LZ4 block `input` (all of them, when there are fewer) into `out`
/// (empty, with room for them), sequence by sequence as the format has them: a token (literal
/// length, match length), the literals, a 2-byte offset back into what was written, the match.
fn lz4_prefix(input: &[u8], want: usize, out: &mut Vec<u8>) -> Result<(), String> {
    /// A length whose 4-bit start is `nibble`: 15 goes on with bytes, each added, until one is
    /// not 255.
    fn length(nibble: u8, input: &[u8], at: &mut usize) -> Option<usize> {
        let mut length = usize::from(nibble);
        if nibble == 15 {
            loop {
                let byte = *input.get(*at)?;
                *at += 1;
                length = length.checked_add(usize::from(byte))?;
                if byte != 255 {
                    break;
                }
            }
        }
        Some(length)
    }
    const CUT: &str = "the block ends inside a sequence";
    let mut at = 0;
    while out.len() < want && at < input.len() {
        let token = input[at];
        at += 1;
        let literals = length(token >> 4, input, &mut at).ok_or(CUT)?;
        let end = at.checked_add(literals).ok_or(CUT)?;
        let literals = input.get(at..end).ok_or(CUT)?;
        at = end;
        out.extend_from_slice(&literals[..literals.len().min(want - out.len())]);
        // The last sequence has literals only.
        if out.len() == want || at == input.len() {
            break;
        }
        let offset = input.get(at..at + 2).ok_or(CUT)?;
        at += 2;
        let offset = usize::from(u16::from_le_bytes([offset[0], offset[1]]));
        let matched = length(token & 15, input, &mut at)
            .and_then(|n| n.checked_add(4))
            .ok_or(CUT)?;
        if offset == 0 || offset > out.len() {
            return Err(format!(
                "a match at byte {} reaches {offset} bytes back",
                out.len()
            ));
        }
        // Byte by byte: a match may overlap what it writes (offset 1 repeats a byte).
        for _ in 0..matched.min(want - out.len()) {
            out.push(out[out.len() - offset]);
        }
    }
    Ok(())
}

/// The first `want` bytes of the zstd frames of `input` (all of them, when there are fewer) into
/// `out` (empty, with room for them), with a streaming decoder of its own: its window is at most
/// [`UNCOMPRESSED_LIMIT`] (a frame that needs more is refused), and it is freed on the way out,
/// so this thread's one-shot decoder does not keep it.
fn zstd_prefix(input: &[u8], want: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let name = |code| zstd_safe::get_error_name(code).to_string();
    let mut context = zstd_safe::DCtx::try_create().ok_or("zstd could not allocate its context")?;
    context
        .set_parameter(zstd_safe::DParameter::WindowLogMax(LIMIT_LOG))
        .map_err(name)?;
    out.resize(want, 0);
    let mut output = zstd_safe::OutBuffer::around(&mut out[..]);
    let mut input = zstd_safe::InBuffer::around(input);
    while output.pos() < want {
        let before = (input.pos(), output.pos());
        context
            .decompress_stream(&mut output, &mut input)
            .map_err(name)?;
        // Nothing more comes out once the input is used up.
        if (input.pos(), output.pos()) == before {
            break;
        }
    }
    let written = output.pos();
    out.truncate(written);
    Ok(())
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

    /// `decompress` of something other than a cubin.
    fn plain(scheme: Scheme, input: &[u8], declared: u64, out: &mut Vec<u8>) -> Refused {
        decompress(scheme, input, declared, Holds::Other, out)
    }

    /// The structural refusal `refused` holds.
    #[track_caller]
    fn reason(refused: Refused) -> String {
        match refused {
            Err(Refusal::Malformed(reason)) => reason,
            other => panic!("not refused for its structure: {other:?}"),
        }
    }

    #[test]
    fn streams_decompress_to_exactly_what_they_declare() {
        let text = b"the quick brown fox jumps over the lazy dog".repeat(9);
        let block = lz4_literals(&text);
        let mut out = vec![7; 3];
        plain(Scheme::Lz4, &block, text.len() as u64, &mut out).unwrap();
        assert_eq!(out, text);
        let fewer = plain(Scheme::Lz4, &block, text.len() as u64 + 1, &mut out);
        assert!(reason(fewer).contains("decompress to"));
        let more = plain(Scheme::Lz4, &block, text.len() as u64 - 1, &mut out);
        assert!(reason(more).contains("do not decompress"));
        // A byte of garbage after the block.
        let trailing = [&block[..], &[0x42]].concat();
        assert!(plain(Scheme::Lz4, &trailing, text.len() as u64, &mut out).is_err());
        // Two bytes: a match whose offset reaches before the start.
        let trailing = [&block[..], &[0x00, 0xff, 0xff]].concat();
        assert!(plain(Scheme::Lz4, &trailing, text.len() as u64, &mut out).is_err());
    }

    #[test]
    fn declared_sizes_beyond_the_format_are_refused_before_allocating() {
        let mut out = Vec::new();
        let e = reason(plain(Scheme::Zstd, &[0; 10], 1 << 20, &mut out));
        assert!(
            e.contains("more than 10 zstd-compressed bytes can hold"),
            "{e}"
        );
        let e = reason(plain(Scheme::Lz4, &[0; 10], 10 * 255 + 65, &mut out));
        assert!(e.contains("more than 10 LZ4"), "{e}");
        assert_eq!(out.capacity(), 0);
        let e = reason(plain(Scheme::Zstd, b"not zstd at all", 15, &mut out));
        assert!(e.contains("do not decompress"), "{e}");
    }

    #[test]
    fn declared_sizes_beyond_the_limit_are_refused_before_anything_is_allocated() {
        let mut out = Vec::new();
        // Enough bytes to hold that much, at the format's highest ratio.
        let input = vec![0; (UNCOMPRESSED_LIMIT * 2 / 255) as usize];
        for declared in [UNCOMPRESSED_LIMIT + 1, UNCOMPRESSED_LIMIT * 2] {
            for holds in [Holds::Cubin, Holds::Other] {
                for scheme in [Scheme::Lz4, Scheme::Zstd] {
                    let refused = decompress(scheme, &input, declared, holds, &mut out);
                    let what = String::new();
                    assert_eq!(refused, Err(Refusal::TooLarge { what, declared }));
                }
            }
        }
        assert_eq!(out.capacity(), 0);
    }

    /// `cubin` followed by zeros, `declared` bytes in all, as one zstd frame: the cubin in raw
    /// blocks, the zeros in run-length blocks of 128 KiB (4 bytes each).
    fn zstd_bomb(cubin: &[u8], declared: u64) -> Vec<u8> {
        // An 8-byte content size, a 128 KiB window.
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0xc0, 7 << 3];
        frame.extend_from_slice(&declared.to_le_bytes());
        let mut blocks: Vec<(usize, u32)> = cubin.chunks(128 << 10).map(|c| (c.len(), 0)).collect();
        let mut zeros = declared - cubin.len() as u64;
        while zeros > 0 {
            let size = zeros.min(128 << 10);
            blocks.push((size as usize, 1));
            zeros -= size;
        }
        let (last, mut raw) = (blocks.len() - 1, cubin);
        for (i, (size, kind)) in blocks.into_iter().enumerate() {
            let header = ((size as u32) << 3) | (kind << 1) | u32::from(i == last);
            frame.extend_from_slice(&header.to_le_bytes()[..3]);
            if kind == 0 {
                let (block, rest) = raw.split_at(size);
                frame.extend_from_slice(block);
                raw = rest;
            } else {
                frame.push(0);
            }
        }
        frame
    }

    /// `cubin` followed by zeros, `declared` bytes in all, as one LZ4 block: literals, a match
    /// of offset 1, five literal zeros.
    fn lz4_bomb(cubin: &[u8], declared: u64) -> Vec<u8> {
        let length = |block: &mut Vec<u8>, mut rest: u64| {
            while rest >= 255 {
                block.push(255);
                rest -= 255;
            }
            block.push(rest as u8);
        };
        let literals = cubin.len() as u64 + 1;
        let mut block = vec![0xff];
        length(&mut block, literals - 15);
        block.extend_from_slice(cubin);
        block.extend_from_slice(&[0, 1, 0]);
        length(&mut block, declared - literals - 5 - 4 - 15);
        block.extend_from_slice(&[0x50, 0, 0, 0, 0, 0]);
        block
    }

    #[test]
    fn a_cubin_decompresses_no_further_than_its_headers_reach() {
        let cubin = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0].1;
        let len = cubin.len() as u64;
        /// Makes a stream of a cubin followed by zeros, so many bytes in all.
        type Bomb = fn(&[u8], u64) -> Vec<u8>;
        let bombs: [(Scheme, Bomb); 2] = [(Scheme::Zstd, zstd_bomb), (Scheme::Lz4, lz4_bomb)];
        for (scheme, bomb) in bombs {
            let mut out = Vec::new();
            // Exactly the cubin, or a little more: decompressed whole, then refused.
            let exact = bomb(cubin, len + 64);
            decompress(scheme, &exact, len + 64, Holds::Other, &mut out).unwrap();
            assert_eq!(&out[..cubin.len()], cubin);
            let e = reason(decompress(scheme, &exact, len + 64, Holds::Cubin, &mut out));
            assert!(
                e.contains(&format!("headers describe {}", Size(len))),
                "{e}"
            );
            // Far more, under the limit: refused after decompressing its start only.
            let declared = 64 << 20;
            let far = bomb(cubin, declared);
            let mut out = Vec::new();
            let e = reason(decompress(scheme, &far, declared, Holds::Cubin, &mut out));
            assert!(
                e.contains("the cubin's headers describe"),
                "{scheme:?}: {e}"
            );
            assert!(out.capacity() < 1 << 20, "{scheme:?}: {}", out.capacity());
            // Not a cubin at all: refused from its first bytes.
            let junk = bomb(&[0x42; 100], declared);
            let e = reason(decompress(scheme, &junk, declared, Holds::Cubin, &mut out));
            assert!(e.contains("not the header of a 64-bit"), "{scheme:?}: {e}");
        }
        // A stream that ends before the tables its start says it holds.
        let half = &cubin[..cubin.len() / 2];
        let cut = zstd_bomb(half, half.len() as u64);
        let mut out = Vec::new();
        let e = reason(decompress(
            Scheme::Zstd,
            &cut,
            16 << 20,
            Holds::Cubin,
            &mut out,
        ));
        assert!(
            e.contains(&format!("decompress to {} bytes", Size(half.len() as u64))),
            "{e}"
        );
    }

    #[test]
    fn starts_decompress_as_the_whole_does() {
        let cubin = atlas_kernels::cubin_for_model("demo", 90).unwrap()[0].1;
        let ptx = atlas_kernels::ptx_for_model("demo").unwrap()[0].1;
        for text in [cubin, ptx] {
            let streams = [
                (Scheme::Lz4, lz4_flex::block::compress(text)),
                (Scheme::Lz4, lz4_literals(text)),
                (Scheme::Zstd, zstd_bomb(text, text.len() as u64)),
                (Scheme::Zstd, zstd::bulk::compress(text, 3).unwrap()),
            ];
            for (scheme, stream) in streams {
                let mut out = Vec::new();
                for want in [0, 1, 64, 1000, text.len(), text.len() + 10] {
                    prefix(scheme, &stream, want as u64, &mut out).unwrap();
                    assert_eq!(out, text[..want.min(text.len())], "{scheme:?} {want}");
                }
            }
        }
    }
}
