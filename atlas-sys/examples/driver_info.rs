//! Prints the driver's version and devices, or one line saying why the driver cannot be used.
//!
//! `cargo run -p atlas-sys --example driver_info`; set `ATLAS_LIBCUDA_PATH` to choose the library.

use std::ffi::CStr;
use std::process::ExitCode;

use atlas_sys::{CUresult, driver, entry};

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cuda = driver()?;
    let check = |status: CUresult, call: &str| -> Result<(), String> {
        if status == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{call} failed with code {}", status.0))
        }
    };
    let (init, version) = (entry!(cuda, cuInit)?, entry!(cuda, cuDriverGetVersion)?);
    let (count, get, name) = (
        entry!(cuda, cuDeviceGetCount)?,
        entry!(cuda, cuDeviceGet)?,
        entry!(cuda, cuDeviceGetName)?,
    );
    let (mut v, mut n) = (0, 0);
    // SAFETY: flags by value, then pointers to live locals.
    unsafe {
        check(init(0), "cuInit")?;
        check(version(&mut v), "cuDriverGetVersion")?;
        check(count(&mut n), "cuDeviceGetCount")?;
    }
    println!("CUDA driver {}.{}, {n} device(s)", v / 1000, v % 1000 / 10);
    for ordinal in 0..n {
        let mut dev = 0;
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: pointers to live locals; the buffer's length is passed with it.
        unsafe {
            check(get(&mut dev, ordinal), "cuDeviceGet")?;
            check(
                name(buf.as_mut_ptr(), buf.len() as i32, dev),
                "cuDeviceGetName",
            )?;
        }
        // SAFETY: cuDeviceGetName wrote a NUL-terminated string into buf.
        let device_name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        println!("  {ordinal}: {}", device_name.to_string_lossy());
    }
    Ok(())
}

/// What `--help` and `-h` print.
const USAGE: &str = "\
usage: driver_info

Prints the CUDA driver's version and devices, or one line saying why the driver cannot be used
(and exits with status 1). ATLAS_LIBCUDA_PATH chooses the driver library.

cargo run -p atlas-sys --example driver_info";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
