//! PTX text, as the driver takes it: a C string (no NUL before its end) of UTF-8 that starts, after
//! whitespace and comments, with the `.version` directive every PTX module begins with (PTX ISA,
//! "PTX Module Directives"). What follows is for the driver's JIT compiler to judge.
//!
//! Text that does not start so is not PTX (a 3-byte prefix of a cubin is valid UTF-8, and so are
//! most short byte strings), and is refused as a format Atlas does not know.

use super::FORMATS;
use super::read::Check;
use crate::code::target::{Arch, Features};

/// The directive a PTX module starts with.
const VERSION: &[u8] = b".version";

/// Checks PTX `text`, without its terminating NUL.
pub(super) fn check(text: &[u8]) -> Check {
    check_nul(text)?;
    let text = match std::str::from_utf8(text) {
        Ok(text) => text,
        Err(e) => {
            return Err(format!(
                "the text is not UTF-8 from byte {} on, so not PTX; Atlas takes {FORMATS}",
                e.valid_up_to()
            ));
        }
    };
    let start = first_token(text.as_bytes())?;
    if !is_version(text.get(start..).unwrap_or_default()) {
        return Err(format!(
            "the text does not start with a `.version` directive (after whitespace and comments), \
             as every PTX module does, so it is not PTX; Atlas takes {FORMATS}"
        ));
    }
    Ok(())
}

/// Checks that PTX `text`, without its terminating NUL, has no NUL before its end: all that
/// [`check`] checks of text that is UTF-8 and [`starts_as_ptx`].
pub(super) fn check_nul(text: &[u8]) -> Check {
    // `contains` on bytes is the word-at-a-time search; the position only on the way out.
    if text.contains(&0) {
        let at = text.iter().position(|&b| b == 0).unwrap_or_default();
        return Err(format!("the PTX text has a NUL byte at offset {at}"));
    }
    Ok(())
}

/// Whether `text` starts as PTX does: after whitespace and comments, a `.version` directive.
pub(super) fn starts_as_ptx(text: &str) -> bool {
    first_token(text.as_bytes())
        .is_ok_and(|start| is_version(text.get(start..).unwrap_or_default()))
}

/// What the directives a PTX module starts with say: the PTX ISA version of `.version` and the
/// first architecture of `.target` (`sm_90a`: 90, "a"). `None` where the text does not say it in
/// the form the PTX ISA gives (`.version 9.0`, then `.target sm_90`); the driver judges then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    /// `(major, minor)` of `.version`.
    pub(crate) isa: Option<(u32, u32)>,
    /// The architecture of `.target`'s first entry: its SM number and the feature set its suffix
    /// names (`a`, `f`; another letter is taken as none).
    pub(crate) target: Option<Arch>,
}

/// The [`Header`] of PTX `text` (anything after its terminating NUL is not read). Reads only the
/// first two directives; never fails.
pub(crate) fn header(text: &[u8]) -> Header {
    // `CStr` finds the NUL a word at a time.
    let text = std::ffi::CStr::from_bytes_until_nul(text).map_or(text, std::ffi::CStr::to_bytes);
    let mut header = Header::default();
    let Some(rest) = directive(text, VERSION) else {
        return header;
    };
    let (number, rest) = split_token(rest);
    header.isa = std::str::from_utf8(number)
        .ok()
        .and_then(|n| n.split_once('.'))
        .and_then(|(major, minor)| Some((plain_number(major)?, plain_number(minor)?)));
    header.target = directive(rest, b".target")
        .map(|rest| split_token(rest).0)
        .and_then(|target| target.split(|&b| b == b',').next())
        .and_then(|target| target.strip_prefix(b"sm_"))
        .and_then(|sm| {
            let digits = sm.iter().take_while(|b| b.is_ascii_digit()).count();
            let features = match sm.get(digits..) {
                Some(b"a") => Features::Specific,
                Some(b"f") => Features::Family,
                _ => Features::Baseline,
            };
            Some(Arch {
                sm: plain_number(std::str::from_utf8(sm.get(..digits)?).ok()?)?,
                features,
            })
        });
    header
}

/// What follows directive `name` and the whitespace after it, when `text` starts with it (after
/// whitespace and comments).
fn directive<'t>(text: &'t [u8], name: &[u8]) -> Option<&'t [u8]> {
    let rest = text.get(first_token(text).ok()?..)?.strip_prefix(name)?;
    let blank = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
    (blank > 0).then(|| rest.get(blank..).unwrap_or_default())
}

/// The token `text` starts with (up to whitespace or a comment), and what follows it.
fn split_token(text: &[u8]) -> (&[u8], &[u8]) {
    let end = text
        .iter()
        .position(|&b| b.is_ascii_whitespace() || b == b'/')
        .unwrap_or(text.len());
    text.split_at(end)
}

/// A decimal number of digits only (no sign, no spaces), that fits a `u32`.
fn plain_number(digits: &str) -> Option<u32> {
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Whether `rest` starts with the `.version` directive.
fn is_version(rest: &str) -> bool {
    rest.as_bytes()
        .strip_prefix(VERSION)
        .is_some_and(|after| after.first().is_none_or(u8::is_ascii_whitespace))
}

/// Where the first token of `text` starts, after whitespace and `//` and `/* */` comments. (Every
/// load of PTX starts here, and nvcc's PTX with a comment of seven lines: one pass over the bytes,
/// without slicing at every step.)
fn first_token(bytes: &[u8]) -> Check<usize> {
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        match (b, bytes.get(at + 1)) {
            (b'/', Some(b'/')) => {
                at += 2;
                while bytes.get(at).is_some_and(|&c| c != b'\n') {
                    at += 1;
                }
            }
            (b'/', Some(b'*')) => match bytes
                .get(at + 2..)
                .unwrap_or_default()
                .windows(2)
                .position(|w| w == b"*/")
            {
                Some(end) => at += 2 + end + 2,
                None => {
                    return Err(format!(
                        "the PTX text's `/*` comment at byte {at} is never closed"
                    ));
                }
            },
            _ if b.is_ascii_whitespace() => at += 1,
            _ => return Ok(at),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_starts_with_its_version_after_comments() {
        for good in [
            &b".version 9.0\n.target sm_90\n"[..],
            b"\n\t .version 8.0",
            b".version\t7.8",
            b"//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 9.0\n",
            b"/* a block */ /* and\n another */\n.version 9.0",
            b"// caf\xc3\xa9\n.version 9.0",
            b".version",
        ] {
            assert_eq!(check(good), Ok(()), "{:?}", String::from_utf8_lossy(good));
        }
        for (bad, says) in [
            (&b""[..], "does not start with a `.version`"),
            (b"\x7fEL", "does not start with a `.version`"),
            (b"// no kernels here\n", "does not start with a `.version`"),
            (b".versions 9.0", "does not start with a `.version`"),
            (
                b".target sm_90\n.version 9.0",
                "does not start with a `.version`",
            ),
            (b"/* open .version 9.0", "comment at byte 0 is never closed"),
            (b".version 9.0\n\xc3", "not UTF-8 from byte 13 on"),
            (b".version 9.0\0more", "a NUL byte at offset 12"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        assert!(check(b"hello").unwrap_err().contains("Atlas takes PTX"));
    }

    #[test]
    fn the_header_is_the_isa_version_and_the_first_target() {
        let read = |text: &[u8]| {
            let h = header(text);
            (h.isa, h.target.map(|arch| arch.to_string()))
        };
        for (text, isa, target) in [
            (
                &b".version 9.0\n.target sm_90\n"[..],
                (9, 0),
                Some("90".into()),
            ),
            (
                b"//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 8.0\n.target sm_75\n\
                  .address_size 64\0.version 1.0",
                (8, 0),
                Some("75".into()),
            ),
            (
                b".version 12.10 /* c */ .target sm_120f, debug",
                (12, 10),
                Some("120f".into()),
            ),
            (
                b".version 9.0\n.target sm_90a,texmode_independent",
                (9, 0),
                Some("90a".into()),
            ),
            (
                b".version\t7.8\n// no target\n.address_size 64",
                (7, 8),
                None,
            ),
        ] {
            let shown = String::from_utf8_lossy(text);
            assert_eq!(read(text), (Some(isa), target), "{shown:?}");
        }
        for unreadable in [
            &b".version 9\n.target sm_90"[..],
            b".version 9.x",
            b".version +9.0",
            b".version 9.99999999999",
        ] {
            assert_eq!(
                header(unreadable).isa,
                None,
                "{:?}",
                String::from_utf8_lossy(unreadable)
            );
        }
        assert_eq!(read(b".target sm_90\n.version 9.0"), (None, None));
        assert_eq!(
            read(b".version 9.0\n.target compute_90"),
            (Some((9, 0)), None)
        );
        assert_eq!(read(b""), (None, None));
        assert_eq!(read(b".version"), (None, None));
        // A suffix Atlas does not know is none: the driver judges the text.
        assert_eq!(
            read(b".version 9.0\n.target sm_90x"),
            (Some((9, 0)), Some("90".into()))
        );
    }
}
