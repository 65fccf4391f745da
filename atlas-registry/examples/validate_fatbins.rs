//! Checks every fatbin in libraries and object files (their `.nv_fatbin` and `__nv_relfatbin`
//! sections) and in fatbin files, as `validate_blob` (for any device) and as a load on a device of
//! one compute capability checks them, and times both.
//!
//! `cargo run --release -p atlas-registry --example validate_fatbins -- [--cc 9.0] PATH...`, each
//! path a file or a directory (searched for files). Prints per file the fatbins found, how many
//! each check refused (with the first refusals), and the time each check took; then the largest
//! fatbins with their times. Needs no GPU. The exit status is 1 when anything was refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use atlas_registry::{validate_blob, validate_blob_for_device};
use object::{Object, ObjectSection};

/// The fatbin magic, `0xBA55ED50`, as it is stored.
const MAGIC: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();

/// The fatbins of `data`: the file itself, or those of its fatbin sections, one after another at
/// 8-byte boundaries.
fn fatbins(data: &[u8]) -> Vec<&[u8]> {
    if data.starts_with(&MAGIC) {
        return vec![data];
    }
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for section in file.sections() {
        let name = section.name().unwrap_or_default();
        if name != ".nv_fatbin" && name != "__nv_relfatbin" {
            continue;
        }
        let Ok(bytes) = section.data() else { continue };
        let mut at = 0usize;
        while let Some(header) = bytes.get(at..at + 16) {
            if header[..4] != MAGIC {
                at += 8;
                continue;
            }
            let size = usize::from(u16::from_le_bytes([header[6], header[7]]))
                + u64::from_le_bytes(header[8..16].try_into().unwrap_or_default()) as usize;
            let end = (at + size).min(bytes.len());
            found.push(&bytes[at..end]);
            at = (end + 7) & !7;
        }
    }
    found
}

fn files(path: &Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            paths.sort();
            for p in paths {
                files(&p, out);
            }
        }
        Err(_) if path.is_file() => out.push(path.to_path_buf()),
        Err(_) => {}
    }
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: validate_fatbins [--cc MAJOR.MINOR] PATH...

Checks every fatbin found under each PATH (fatbin files, and the .nv_fatbin and __nv_relfatbin
sections of libraries and object files) as validate_blob does for any device, and as a load on a
device of compute capability MAJOR.MINOR (9.0 when not given) does, and times both. Exits with
status 1 when anything was refused. Needs no GPU.

cargo run --release -p atlas-registry --example validate_fatbins -- PATH...";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut cc = (9, 0);
    if let Some(at) = args.iter().position(|a| a == "--cc") {
        let value = args.get(at + 1).cloned().unwrap_or_default();
        let (major, minor) = value.split_once('.').unwrap_or(("9", "0"));
        cc = (major.parse().unwrap_or(9), minor.parse().unwrap_or(0));
        args.drain(at..(at + 2).min(args.len()));
    }
    let mut paths = Vec::new();
    for arg in &args {
        files(Path::new(arg), &mut paths);
    }
    let (mut total, mut refused_any, mut refused_device) = (0usize, 0usize, 0usize);
    let (mut time_any, mut time_device) = (Duration::ZERO, Duration::ZERO);
    let mut largest: Vec<(usize, String, Duration, Duration)> = Vec::new();
    for path in &paths {
        let Ok(data) = std::fs::read(path) else {
            continue;
        };
        let found = fatbins(&data);
        if found.is_empty() {
            continue;
        }
        let name = path.display().to_string();
        let (mut any, mut device) = (0usize, 0usize);
        let (mut t_any, mut t_device) = (Duration::ZERO, Duration::ZERO);
        for (i, fatbin) in found.iter().enumerate() {
            let start = Instant::now();
            let all = validate_blob("fatbin", fatbin);
            let a = start.elapsed();
            let start = Instant::now();
            let one = validate_blob_for_device("fatbin", fatbin, cc);
            let d = start.elapsed();
            (t_any, t_device) = (t_any + a, t_device + d);
            if let Err(e) = &all {
                any += 1;
                if any <= 3 {
                    println!("  {name} fatbin {i}: validate_blob: {e}");
                }
            }
            if let Err(e) = &one {
                device += 1;
                if device <= 3 {
                    println!("  {name} fatbin {i}: for {}.{}: {e}", cc.0, cc.1);
                }
            }
            largest.push((fatbin.len(), format!("{name} fatbin {i}"), a, d));
            largest.sort_by_key(|x| std::cmp::Reverse(x.0));
            largest.truncate(5);
        }
        println!(
            "{name}: {} fatbins, refused {any} (all entries, {:.1} ms) and {device} (sm_{}{}, {:.1} ms)",
            found.len(),
            t_any.as_secs_f64() * 1e3,
            cc.0,
            cc.1,
            t_device.as_secs_f64() * 1e3
        );
        total += found.len();
        (refused_any, refused_device) = (refused_any + any, refused_device + device);
        (time_any, time_device) = (time_any + t_any, time_device + t_device);
    }
    println!(
        "in all: {total} fatbins; validate_blob refused {refused_any} ({:.2} s), the sm_{}{} check {refused_device} ({:.2} s)",
        time_any.as_secs_f64(),
        cc.0,
        cc.1,
        time_device.as_secs_f64()
    );
    for (len, what, a, d) in &largest {
        println!(
            "largest: {what}: {:.1} MB, all entries {:.1} ms, sm_{}{} entries {:.1} ms",
            *len as f64 / 1e6,
            a.as_secs_f64() * 1e3,
            cc.0,
            cc.1,
            d.as_secs_f64() * 1e3
        );
    }
    if refused_any + refused_device > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
