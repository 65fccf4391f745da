//! What checking a hostile blob costs in memory: compressed fatbin entries that declare far more
//! bytes than they hold ("bombs"), each a real cubin followed by zeros, in a fatbin of its one
//! entry, zstd (flag 0x8000: a raw block of the cubin, then run-length blocks of 128 KiB of zeros
//! at 4 bytes each, the format's highest ratio; with a 128 KiB window, and single-segment as nvcc
//! writes its frames, the window then being the whole declared size) and LZ4 (flag 0x2000: the cubin as literals, then
//! one match of offset 1 as long as the rest, at 255 bytes of output per input byte).
//!
//! Each scheme's bombs are checked by `validate_blob` in a child process of their own, so that
//! its peak resident memory is theirs alone; a global allocator here counts the bytes this
//! thread holds, and its peak while each bomb is checked:
//!
//! - 1 GiB and 4 GiB declared: refused before anything is decompressed (past
//!   `UNCOMPRESSED_LIMIT`), holding under 1 MiB;
//! - 200 MiB declared (under the limit): refused because the cubin's own headers end long before
//!   (nothing describes the zeros), after decompressing only the start that holds its headers;
//!   under 1 MiB;
//! - PTX followed by zeros, 64 MiB declared: passes at the cost of the 64 MiB (PTX has no headers
//!   that say how long it is), bounded by the limit.
//!
//! and the child's peak resident memory (zstd's own buffers included) stays under 256 MiB.
//!
//! `cargo test -p atlas-registry --test validation_memory`

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use atlas_registry::{AtlasError, BlobKind, UNCOMPRESSED_LIMIT, validate_blob};
use support::child::{self, Ending};
use support::fatbin::{Entry, FLAG_LZ4, FLAG_ZSTD, FLAGS_COMPRESSED, Fatbin, KIND_ELF, KIND_PTX};
use support::fixtures::FIXTURES;

child::bodies!(zstd_bombs, lz4_bombs);

// ---------------------------------------------------------------------------------------------
// Counting what this thread holds
// ---------------------------------------------------------------------------------------------

/// The system allocator, counting the bytes each thread holds and their peak.
struct Counting;

thread_local! {
    /// Bytes allocated by this thread and not freed (by it), since the thread started.
    static HELD: Cell<isize> = const { Cell::new(0) };
    /// The most `HELD` has been since [`peak_of`] last reset it.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// Counts `bytes` (negative: freed) against this thread. `try_with`: a thread being torn down
/// has no counters left, and allocates nothing that matters here.
fn count(bytes: isize) {
    let _ = HELD.try_with(|held| {
        let now = held.get() + bytes;
        held.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to `System` with the caller's own arguments, so each duty
// `GlobalAlloc` puts on an allocator is `System`'s, which meets them; the counting touches only
// `const`-initialised thread-locals that need no allocation and no destructor.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's duties for `alloc` (a non-zero size) are passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: the caller promises `p` came from this allocator (so from `System`) with
        // `layout`.
        unsafe { System.dealloc(p, layout) };
        count(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's duties for `realloc` are passed on unchanged.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            count(new_size as isize - layout.size() as isize);
        }
        q
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `f` returns, and the most bytes this thread held meanwhile beyond what it held before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = HELD.with(Cell::get);
    PEAK.with(|peak| peak.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - start).max(0) as usize)
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmHWM line");
    kib * 1024
}

// ---------------------------------------------------------------------------------------------
// Bombs
// ---------------------------------------------------------------------------------------------

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// What the brief of these tests allows one check to hold at its peak, resident.
const MOST_RESIDENT: u64 = 256 * MIB;
/// What a bomb refused before its bulk is decompressed may hold at its peak: the start of it
/// that says how long it is, and the refusal's text.
const MOST_FOR_A_REFUSAL: usize = MIB as usize;

/// The largest block zstd writes: 128 KiB.
const ZSTD_BLOCK: usize = 128 << 10;

/// One zstd frame that declares `declared` bytes (its content size, 8 bytes, in the frame
/// header) and holds `code` in raw blocks, then zeros in run-length blocks; a 128 KiB window.
fn zstd_bomb(code: &[u8], declared: u64) -> Vec<u8> {
    // Frame header descriptor: an 8-byte content size, not single-segment, no checksum, no
    // dictionary; the window descriptor: 2^(10 + 7) bytes.
    zstd_frame(&[0xc0, 7 << 3], code, declared)
}

/// As [`zstd_bomb`], single-segment as nvcc writes its frames: the window is the whole content,
/// which a streaming decoder sets aside whole.
fn zstd_single_segment_bomb(code: &[u8], declared: u64) -> Vec<u8> {
    zstd_frame(&[0xe0], code, declared)
}

/// A zstd frame of header descriptor (and window descriptor) `descriptors`, as [`zstd_bomb`].
fn zstd_frame(descriptors: &[u8], code: &[u8], declared: u64) -> Vec<u8> {
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd];
    frame.extend_from_slice(descriptors);
    frame.extend_from_slice(&declared.to_le_bytes());
    // Blocks of `code`, then of zeros: (size, raw 0 / run-length 1).
    let mut blocks: Vec<(usize, u32)> = code.chunks(ZSTD_BLOCK).map(|c| (c.len(), 0)).collect();
    let mut left = declared - code.len() as u64;
    while left > 0 {
        let size = left.min(ZSTD_BLOCK as u64);
        blocks.push((size as usize, 1));
        left -= size;
    }
    let last = blocks.len() - 1;
    let mut code = code;
    for (i, (size, kind)) in blocks.into_iter().enumerate() {
        let header = ((size as u32) << 3) | (kind << 1) | u32::from(i == last);
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        if kind == 0 {
            let (raw, rest) = code.split_at(size);
            frame.extend_from_slice(raw);
            code = rest;
        } else {
            frame.push(0);
        }
    }
    frame
}

/// An LZ4 length past the 15 of a token's nibble: 255s, then the rest.
fn lz4_length(block: &mut Vec<u8>, mut rest: u64) {
    while rest >= 255 {
        block.push(255);
        rest -= 255;
    }
    block.push(rest as u8);
}

/// One LZ4 block that decompresses to `declared` bytes: `code` and a zero as literals, one match
/// of offset 1 (the zero, repeated), five literal zeros to end it as the format asks.
fn lz4_bomb(code: &[u8], declared: u64) -> Vec<u8> {
    let literals = code.len() as u64 + 1;
    let matched = declared - literals - 5;
    assert!(literals >= 15 && matched >= 4 + 15);
    let mut block = vec![0xff];
    lz4_length(&mut block, literals - 15);
    block.extend_from_slice(code);
    block.push(0);
    block.extend_from_slice(&1u16.to_le_bytes());
    lz4_length(&mut block, matched - 4 - 15);
    block.push(0x50);
    block.extend_from_slice(&[0; 5]);
    block
}

/// The sm_90 cubin nvcc 13 made of the `elementwise` kernels, and the header of the fatbin entry
/// it came in.
fn real_cubin() -> (Vec<u8>, Vec<u8>) {
    let fixture = FIXTURES
        .iter()
        .find(|f| f.name == "elementwise.sm_90.zstd.fatbin")
        .expect("the elementwise fixture");
    let fatbin = Fatbin::parse(fixture.bytes).expect("the fixture is a fatbin");
    let entry = fatbin
        .entries
        .iter()
        .find(|e| e.kind() == KIND_ELF && e.arch() == 90)
        .expect("an sm_90 cubin");
    (
        entry.contents().expect("it decompresses"),
        entry.header.clone(),
    )
}

fn put(b: &mut [u8], at: usize, value: &[u8]) {
    b[at..at + value.len()].copy_from_slice(value);
}

/// A fatbin of one entry of `kind` whose payload is `stream`, compressed by `flag`, declaring
/// `declared` bytes uncompressed; the rest of its header is `header`'s.
fn fatbin_of(header: &[u8], kind: u16, flag: u64, stream: &[u8], declared: u64) -> Vec<u8> {
    let mut header = header.to_vec();
    let mut payload = stream.to_vec();
    payload.resize(payload.len().div_ceil(8) * 8, 0);
    let flags = (u64::from_le_bytes(header[40..48].try_into().unwrap()) & !FLAGS_COMPRESSED) | flag;
    put(&mut header, 0, &kind.to_le_bytes());
    put(&mut header, 8, &(payload.len() as u64).to_le_bytes());
    put(
        &mut header,
        16,
        &u32::try_from(stream.len()).unwrap().to_le_bytes(),
    );
    put(&mut header, 40, &flags.to_le_bytes());
    put(&mut header, 56, &declared.to_le_bytes());
    let mut fatbin = vec![0u8; 16];
    put(&mut fatbin, 0, &0xBA55_ED50u32.to_le_bytes());
    put(&mut fatbin, 4, &1u16.to_le_bytes());
    put(&mut fatbin, 6, &16u16.to_le_bytes());
    Fatbin {
        header: fatbin,
        entries: vec![Entry { header, payload }],
    }
    .bytes()
}

/// Checks `fatbin`, printing what it held at its peak; the verdict and that peak.
fn check(what: &str, fatbin: &[u8]) -> (Result<BlobKind, AtlasError>, usize) {
    let (verdict, peak) = peak_of(|| validate_blob(what, fatbin));
    println!(
        "{what}: {} bytes, {} at a peak of {peak} bytes held",
        fatbin.len(),
        match &verdict {
            Ok(kind) => format!("passes as {kind:?}"),
            Err(e) => format!("refused ({e})"),
        },
    );
    (verdict, peak)
}

/// The bombs of one scheme, `bomb` making its stream of code and a declared size.
fn bombs(scheme: &str, flag: u64, bomb: fn(&[u8], u64) -> Vec<u8>) {
    let (cubin, header) = real_cubin();
    for declared in [GIB, 4 * GIB, 200 * MIB] {
        let what = format!("{scheme} cubin + zeros, {} MiB declared", declared / MIB);
        let fatbin = fatbin_of(&header, KIND_ELF, flag, &bomb(&cubin, declared), declared);
        let (verdict, peak) = check(&what, &fatbin);
        match verdict {
            Err(AtlasError::TooLargeToCheck {
                entry,
                declared: said,
                limit,
                ..
            }) if declared > UNCOMPRESSED_LIMIT => {
                assert!(entry.starts_with("fatbin entry 0 (ELF sm_90"), "{entry}");
                assert_eq!((said, limit), (declared, UNCOMPRESSED_LIMIT));
            }
            Err(AtlasError::InvalidModule { reason, .. }) if declared <= UNCOMPRESSED_LIMIT => {
                assert!(reason.contains("the cubin's headers describe"), "{reason}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(
            peak < MOST_FOR_A_REFUSAL,
            "{what}: {peak} bytes held at the peak of its check, more than {MOST_FOR_A_REFUSAL}"
        );
    }
    println!("peak resident memory: {} bytes", peak_resident());
    assert!(
        peak_resident() < MOST_RESIDENT,
        "resident past {MOST_RESIDENT}"
    );
}

fn zstd_bombs() {
    bombs("zstd", FLAG_ZSTD, zstd_bomb);
    bombs("zstd single-segment", FLAG_ZSTD, zstd_single_segment_bomb);
    // PTX says nothing of its own length but where its NUL is: a PTX bomb under the limit costs
    // what it declares, and passes (the driver reads the text to its NUL).
    let (_, header) = real_cubin();
    let ptx = atlas_kernels::ptx_for_model("demo").expect("the demo PTX")[0].1;
    let text = [ptx, b"\0"].concat();
    let declared = 64 * MIB;
    let fatbin = fatbin_of(
        &header,
        KIND_PTX,
        FLAG_ZSTD,
        &zstd_bomb(&text, declared),
        declared,
    );
    let (verdict, peak) = check("zstd PTX + zeros, 64 MiB declared", &fatbin);
    assert_eq!(verdict.ok(), Some(BlobKind::Fatbin));
    assert!(
        (declared as usize..(declared + MIB) as usize).contains(&peak),
        "the PTX bomb held {peak} bytes at its peak, not the {declared} it declares"
    );
    assert!(
        peak_resident() < MOST_RESIDENT,
        "resident past {MOST_RESIDENT}"
    );
    println!("CHILD done");
}

fn lz4_bombs() {
    bombs("LZ4", FLAG_LZ4, lz4_bomb);
    println!("CHILD done");
}

fn expect_done(child: child::Child, what: &str) {
    child.print_tail(what);
    assert!(
        child.ending == Ending::Passed && child.stdout.contains("CHILD done"),
        "{child}"
    );
}

#[test]
fn zstd_bombs_are_refused_holding_little() {
    expect_done(child::run_on(zstd_bombs, None), "zstd_bombs");
}

#[test]
fn lz4_bombs_are_refused_holding_little() {
    expect_done(child::run_on(lz4_bombs, None), "lz4_bombs");
}
