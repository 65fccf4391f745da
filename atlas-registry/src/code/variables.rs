//! The variables a blob defines for `cuModuleGetGlobal` to find (`__device__`, `__constant__`,
//! `__managed__`): their names, listed where a lookup of another name is not found.
//!
//! - PTX: the module-scope `.global` and `.const` declarations (not `.extern` ones, defined
//!   elsewhere), read with [`ptx_lexer`](crate::code::ptx_lexer); bodies and parameter lists are
//!   skipped.
//! - ELF cubin: the defined object symbols, of any binding (a `.global` that is not `.visible` is
//!   a local symbol, and `cuModuleGetGlobal` finds it), but the compiler's own (`$str`).
//!
//! Anything else, or code that cannot be read, lists nothing: the names are a hint, never a
//! reason to refuse.

use object::elf;

use crate::code::blob::elf::{Elf, Machines, c_string};
use crate::code::ptx_lexer::{Lexer, Token};

/// The names of the variables `code` (a PTX text or an ELF cubin) defines, in order of
/// definition; none for anything else.
pub(crate) fn variable_names(code: &[u8]) -> Vec<String> {
    let names = if code.starts_with(b"\x7fELF") {
        cubin_variables(code)
    } else {
        ptx_variables(code)
    };
    names.unwrap_or_default()
}

fn cubin_variables(cubin: &[u8]) -> Option<Vec<String>> {
    let image = Elf::parse(cubin, "cubin", Machines::Cuda).ok()?;
    let (symbols, strings) = image.symbol_table().ok()??;
    let names = symbols
        .iter()
        .filter(|s| s.kind == elf::STT_OBJECT && s.shndx != elf::SHN_UNDEF)
        .filter_map(|s| std::str::from_utf8(c_string(strings, s.name)?).ok())
        // `$str` and the like: the compiler's own, never a variable of the source.
        .filter(|name| !name.is_empty() && !name.starts_with(['$', '.']))
        .map(str::to_owned)
        .collect();
    Some(names)
}

fn ptx_variables(ptx: &[u8]) -> Option<Vec<String>> {
    let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
    let mut lexer = Lexer::new(std::str::from_utf8(&ptx[..end]).ok()?);
    let mut names = Vec::new();
    // Within a module-scope declaration: whether it is `.extern`, and whether it declares a
    // variable of `.global` or `.const` whose name has not come yet.
    let (mut external, mut variable) = (false, false);
    loop {
        let (token, line) = lexer.next().ok()?;
        match token {
            Token::End => return Some(names),
            Token::Punct('{') => {
                lexer.skip_block(line).ok()?;
                (external, variable) = (false, false);
            }
            Token::Punct('(') => skip_parens(&mut lexer)?,
            Token::Punct(';') => (external, variable) = (false, false),
            Token::Directive(".extern") => external = true,
            Token::Directive(".global" | ".const") => variable = true,
            // A function's or kernel's name, not a variable's.
            Token::Directive(".entry" | ".func") => variable = false,
            Token::Word(name) if variable => {
                if !external {
                    names.push(name.to_owned());
                }
                variable = false;
            }
            _ => {}
        }
    }
}

/// Skips to the `)` that closes a `(` already read.
fn skip_parens(lexer: &mut Lexer<'_>) -> Option<()> {
    let mut depth = 1usize;
    while depth > 0 {
        match lexer.next().ok()?.0 {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            Token::End => return None,
            _ => {}
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_variables_are_the_module_scope_global_and_const_ones_defined_here() {
        let ptx = b"
.version 8.0
.target sm_80
.address_size 64

// .global .u32 in_a_comment;
.extern .global .align 4 .u32 defined_elsewhere;
.global .align 4 .u32 counter;
.visible .global .align 4 .b8 bias[16] = {0, 0, 128, 63};
.const .align 8 .u64 table[2];
.visible .entry k(.param .u64 .ptr .global .align 4 x)
{
    .reg .b32 %r<2>;
    .shared .align 4 .b8 tile[64];
    ret;
}
.visible .global .align 8 .f64 after_the_kernel;
\0";
        assert_eq!(
            variable_names(ptx),
            ["counter", "bias", "table", "after_the_kernel"]
        );
    }

    #[test]
    fn cubin_variables_are_its_defined_global_objects() {
        for &sm in atlas_kernels::CUBIN_ARCHS {
            let blobs = atlas_kernels::cubin_for_model("demo", sm).unwrap();
            let (_, cubin) = blobs
                .iter()
                .find(|(name, _)| *name == "device_global")
                .unwrap();
            assert_eq!(variable_names(cubin), ["bias"], "sm_{sm}");
            let (_, cubin) = blobs
                .iter()
                .find(|(name, _)| *name == "elementwise")
                .unwrap();
            assert!(variable_names(cubin).is_empty(), "sm_{sm}");
        }
    }

    #[test]
    fn unreadable_code_lists_nothing() {
        assert!(variable_names(b"\x7fELF\x02\x01").is_empty());
        assert!(variable_names(b".version 8.0\n/* never closed").is_empty());
        assert!(variable_names(&[0xff, 0xfe]).is_empty());
    }
}
