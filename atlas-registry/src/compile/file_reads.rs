//! Whether NVRTC may read a file from disk for a [`CudaSource`]: the input the compile cache's key
//! cannot cover, so such a compile is never cached ([`CacheOutcome::ReadsFiles`](crate::CacheOutcome::ReadsFiles)).
//!
//! **What NVRTC reads** (measured with NVRTC 12.0; the compile tests check it again with whichever
//! NVRTC they run):
//! - a header given in memory ([`CudaSource::header`]) when an include names it exactly: it is
//!   found before any directory is searched, from the program and from other headers alike;
//! - any other `#include "name"`: a file `name` in the directory of the including file (for the
//!   program, the directory of its name: the working directory for a bare name), then in the
//!   include paths; `#include <name>`: the include paths; an absolute name: that file;
//! - the files and directories that options name: include paths (`-I`, `--include-path`),
//!   pre-included headers (`--pre-include`, `-include`), precompiled headers (`--use-pch`,
//!   `--pch-dir`);
//! - `__has_include` looks on disk only (it answers "no" for a header given in memory), and so do
//!   `#include_next` and `#embed`.
//!
//! **Why refuse rather than hash.** A key that held "every file NVRTC may read" would have to hold
//! what the search finds, not only what it found: a file created later in the program's directory
//! changes what `#include "x.h"` reads, and an include path is a whole directory tree. Hashing the
//! files a compile read would miss exactly those cases, and give back the old code for the new
//! sources. A compile that may read a file is therefore compiled every time; what it reads is the
//! caller's to give in memory when it wants the cache.
//!
//! **How the check errs.** It reads the program and every header as text and errs towards "may
//! read": lines spliced with a backslash (or the trigraph `??/`) are joined first; every word
//! `include` after `#`, `%:`, `??=` or the end of a comment (`*/`) counts as a directive, in
//! comments and string literals too, and must be followed by `"name"` or `<name>` naming one of
//! the source's headers exactly; `embed` after those is a directive that reads; the words
//! `include_next`, `__has_include`, `__has_include_next` and `__has_embed` read wherever they are.
//! A false alarm costs a cache hit, never a wrong result.

use std::borrow::Cow;

use crate::compile::CudaSource;

/// What makes NVRTC read a file for a source, which the compile cache's key does not cover
/// ([`CacheOutcome::ReadsFiles`](crate::CacheOutcome::ReadsFiles)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileRead {
    /// An option naming files or directories NVRTC reads (an include path, a pre-included or a
    /// precompiled header).
    #[error("the option `{option}` makes NVRTC read files")]
    Option {
        /// The option.
        option: String,
    },
    /// A directive that may read a file from disk: an include of a name that is not one of the
    /// source's headers (or not a literal name), or one that only looks on disk.
    #[error(
        "`{directive}` in `{file}` may read a file from disk (only the headers given to the \
         source, included by their exact names, are in the cache's key)"
    )]
    Directive {
        /// The program's or the header's name.
        file: String,
        /// The directive, as written (its first 80 characters).
        directive: String,
    },
}

/// The first reason NVRTC may read a file from disk for `source`, or `None` when it reads only
/// what is in memory (the program, its headers) and its own built-in files.
pub(crate) fn file_read(source: &CudaSource) -> Option<FileRead> {
    if let Some(option) = source.options.iter().find(|o| names_files(o)) {
        return Some(FileRead::Option {
            option: option.clone(),
        });
    }
    let texts = [(&source.name, &source.text)]
        .into_iter()
        .chain(source.headers.iter().map(|(name, text)| (name, text)));
    for (file, text) in texts {
        if let Some(directive) = reading_directive(text, &source.headers) {
            return Some(FileRead::Directive {
                file: file.clone(),
                directive,
            });
        }
    }
    None
}

/// Whether an NVRTC option names files or directories to read (`-I`, `--include-path`,
/// `--pre-include`, `-include`, `-isystem`, the precompiled-header options).
fn names_files(option: &str) -> bool {
    let Some(name) = option.strip_prefix('-') else {
        return false; // the value of the option before it, which was judged itself
    };
    let name = name.trim_start_matches('-');
    let name = name.split('=').next().unwrap_or(name);
    // A macro's name may say anything; defining one reads nothing.
    if name.starts_with(['D', 'U']) || name.ends_with("define-macro") {
        return false;
    }
    name.starts_with('I')
        || name.contains("pch")
        || name.contains("system")
        || (name.contains("include") && name != "no-source-include")
}

/// The first directive of `text` that may read from disk (see the module docs), as written.
///
/// Every word of interest contains `include` or `embed`: the scan looks for those two and takes
/// the whole word around each, so that a cache hit's check stays cheap beside reading the entry.
fn reading_directive(text: &str, headers: &[(String, String)]) -> Option<String> {
    let text = join_spliced_lines(text);
    // `contains` is the standard library's vectorised search: most sources end here.
    if !text.contains("include") && !text.contains("embed") {
        return None;
    }
    let bytes = text.as_bytes();
    let is_word = |b: &u8| b.is_ascii_alphanumeric() || *b == b'_';
    let found = ["include", "embed"].into_iter().flat_map(|needle| {
        text.match_indices(needle)
            .map(|(at, needle)| (at, at + needle.len()))
    });
    let mut first: Option<usize> = None;
    for (at, end) in found {
        let start = at - bytes[..at].iter().rev().take_while(|b| is_word(b)).count();
        let end = end + bytes[end..].iter().take_while(|b| is_word(b)).count();
        let reads = match &text[start..end] {
            "include_next" | "__has_include" | "__has_include_next" | "__has_embed" => true,
            "embed" => after_directive_mark(bytes, start),
            "include" => {
                after_directive_mark(bytes, start) && !names_a_header(&text[end..], headers)
            }
            _ => false,
        };
        if reads && first.is_none_or(|first| start < first) {
            first = Some(start);
        }
    }
    first.map(|start| {
        let from = bytes[..start]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |newline| newline + 1);
        let line = text[from..].lines().next().unwrap_or("");
        line.chars().take(80).collect()
    })
}

/// `text` with every line splice removed: a backslash, or the trigraph `??/`, then blanks and a
/// line end. Joining where the preprocessor would not (trigraphs off) only merges text onto the
/// line before, which hides no `#`.
fn join_spliced_lines(text: &str) -> Cow<'_, str> {
    if !text.contains('\\') && !text.contains("??/") {
        return Cow::Borrowed(text);
    }
    let mut joined = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['\\', '?']) {
        let (before, from) = rest.split_at(at);
        joined.push_str(before);
        let mark = if from.starts_with('\\') {
            1
        } else if from.starts_with("??/") {
            3
        } else {
            joined.push('?');
            rest = &from[1..];
            continue;
        };
        let after = from[mark..].trim_start_matches([' ', '\t', '\x0b', '\x0c', '\r']);
        match after.strip_prefix('\n') {
            Some(next) => rest = next,
            None => {
                joined.push_str(&from[..mark]);
                rest = &from[mark..];
            }
        }
    }
    joined.push_str(rest);
    Cow::Owned(joined)
}

/// Whether the word at `at` follows what can start a directive: `#`, `%:` or `??=`, or the end of
/// a comment that may stand between them (blanks skipped).
fn after_directive_mark(bytes: &[u8], at: usize) -> bool {
    let before = bytes[..at]
        .iter()
        .rev()
        .find(|b| !matches!(b, b' ' | b'\t' | 0x0b | 0x0c | b'\r'));
    matches!(before, Some(b'#' | b':' | b'=' | b'/'))
}

/// Whether `rest` (what follows the word `include`) is a quoted or bracketed name that is one of
/// `headers`, given in memory, exactly.
fn names_a_header(rest: &str, headers: &[(String, String)]) -> bool {
    let rest = rest.trim_start_matches([' ', '\t', '\x0b', '\x0c', '\r']);
    let close = match rest.as_bytes().first() {
        Some(b'"') => '"',
        Some(b'<') => '>',
        _ => return false,
    };
    let operand = &rest[1..];
    let Some(end) = operand.find([close, '\n']) else {
        return false;
    };
    let name = &operand[..end];
    operand[end..].starts_with(close) && headers.iter().any(|(header, _)| header == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(text: &str) -> Option<String> {
        let source = CudaSource::new("k.cu", text)
            .header("h.h", "#define H 1")
            .header("dir/x.h", "#include \"h.h\"");
        file_read(&source).map(|why| why.to_string())
    }

    #[test]
    fn includes_of_headers_given_in_memory_read_nothing() {
        for text in [
            "#include \"h.h\"\n__global__ void k() {}",
            "  #  include <h.h>\n",
            "#include \"dir/x.h\"\n",
            "%:include \"h.h\"\n??=include \"h.h\"\n",
            "#/* a comment */include \"h.h\"\n",
            "// we include the bias, and #included files are listed\n",
            "int include = 1; int embed = 2;\n",
            "#inc\\\nlude \"h\\\n.h\"\n",
        ] {
            assert_eq!(reads(text), None, "{text:?}");
        }
    }

    #[test]
    fn anything_that_may_read_a_file_is_found() {
        for (text, shown) in [
            ("#include \"cwd.h\"\n", "#include \"cwd.h\""),
            ("#include <cuda_fp16.h>\n", "#include <cuda_fp16.h>"),
            (
                "#include \"/usr/include/x.h\"\n",
                "#include \"/usr/include/x.h\"",
            ),
            ("#include \"./h.h\"\n", "#include \"./h.h\""),
            ("#define HDR \"h.h\"\n#include HDR\n", "#include HDR"),
            ("#include /* c */ \"h.h\"\n", "#include /* c */ \"h.h\""),
            ("#inc\\\nlude \"other.h\"\n", "#include \"other.h\""),
            ("#inc??/  \nlude \"other.h\"\n", "#include \"other.h\""),
            ("%:include \"other.h\"\n", "%:include \"other.h\""),
            ("??=include \"other.h\"\n", "??=include \"other.h\""),
            ("#/*\n*/include \"other.h\"\n", "*/include \"other.h\""),
            (
                "#if __has_include(\"h.h\")\n#endif\n",
                "#if __has_include(\"h.h\")",
            ),
            ("#include_next <h.h>\n", "#include_next <h.h>"),
            ("const char c[] = {\n#embed \"h.h\"\n};\n", "#embed \"h.h\""),
            ("#include \"h.h\n", "#include \"h.h"),
        ] {
            let why = reads(text).unwrap_or_else(|| panic!("{text:?} was taken to read nothing"));
            assert!(
                why.contains(shown) && why.contains("`k.cu`"),
                "{text:?}: {why}"
            );
        }
        // In a header too, naming it.
        let source = CudaSource::new("k.cu", "#include \"a.h\"").header("a.h", "#include \"b.h\"");
        assert!(matches!(
            file_read(&source),
            Some(FileRead::Directive { file, .. }) if file == "a.h"
        ));
    }

    #[test]
    fn options_that_name_files_are_found() {
        for option in [
            "-I/usr/local/cuda/include",
            "-I",
            "--include-path=/x",
            "--include-path",
            "-include",
            "--pre-include=x.h",
            "--preinclude=x.h",
            "-isystem",
            "--system-include=/x",
            "--use-pch=x.pch",
            "--pch-dir=/x",
            "-pch",
        ] {
            let source = CudaSource::new("k.cu", "").option(option);
            assert_eq!(
                file_read(&source),
                Some(FileRead::Option {
                    option: option.into()
                }),
                "{option}"
            );
        }
        for option in [
            "-std=c++17",
            "-DINCLUDE_PATH=1",
            "-Dinclude_dir=2",
            "--define-macro=use_pch",
            "--use_fast_math",
            "--no-source-include",
            "-default-device",
            "-lineinfo",
            "/a/value/given/alone",
        ] {
            let source = CudaSource::new("k.cu", "").option(option);
            assert_eq!(file_read(&source), None, "{option}");
        }
    }
}
