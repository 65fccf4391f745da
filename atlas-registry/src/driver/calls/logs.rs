//! The driver's own error log (CUDA 12.9+): `cuLogsCurrent`, `cuLogsDumpToMemory`. A driver
//! without these entry points keeps no log, which is an answer (`None`), never an error.

use atlas_sys::{CUlogIterator, CUresult};

use crate::driver::driver;

/// The most the driver keeps of its log, in bytes (its documentation's figure), and the NUL.
const LOG_BYTES: usize = 25_600 + 1;

/// `cuLogsCurrent`: where the driver will write its next log message, or `None` when the driver
/// keeps no log (an older driver, an injection library) or does not answer.
#[doc(alias = "cuLogsCurrent")]
pub(crate) fn log_position() -> Option<CUlogIterator> {
    let f = driver().ok()?.cuda.cuLogsCurrent.as_ref().ok()?;
    let mut position: CUlogIterator = 0;
    // SAFETY: `position` is a live out-pointer; the flags must be 0.
    let status = unsafe { f(&mut position, 0) };
    (status == CUresult::CUDA_SUCCESS).then_some(position)
}

/// `cuLogsDumpToMemory`: the driver's log messages since `from` (all it keeps for `None`), one a
/// line; `None` when the driver keeps no log or does not answer. The driver's position is copied,
/// so every call reads from the same place.
#[doc(alias = "cuLogsDumpToMemory")]
pub(crate) fn log_since(from: Option<CUlogIterator>) -> Option<String> {
    let f = driver().ok()?.cuda.cuLogsDumpToMemory.as_ref().ok()?;
    let mut buffer = vec![0u8; LOG_BYTES];
    let mut size = buffer.len();
    let mut position = from;
    let iterator = match &mut position {
        Some(position) => position as *mut CUlogIterator,
        None => std::ptr::null_mut(),
    };
    // SAFETY: `buffer` holds `size` writable bytes, which the driver writes no more than (a NUL
    // included); `size` is a live in-out pointer; `iterator` is null or a live position the
    // driver may advance (a copy); the flags must be 0.
    let status = unsafe { f(iterator, buffer.as_mut_ptr().cast(), &mut size, 0) };
    if status != CUresult::CUDA_SUCCESS {
        return None;
    }
    buffer.truncate(size.min(LOG_BYTES - 1));
    if let Some(end) = buffer.iter().position(|&b| b == 0) {
        buffer.truncate(end);
    }
    Some(String::from_utf8_lossy(&buffer).into_owned())
}
