//! NumPy's `.npy` format (version 1.0), as far as the KTIR crosscheck needs it: little-endian
//! f16, f32, f64 and i32 arrays, C order.

use half::f16;
use std::path::Path;

/// An array's elements as a `.npy` file can hold them.
pub enum Array<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    I32(&'a [i32]),
}

/// Writes `a` of `shape` to `path`.
pub fn write(path: &Path, a: Array<'_>, shape: &[usize]) -> std::io::Result<()> {
    let (descr, bytes): (&str, Vec<u8>) = match a {
        Array::F16(v) => ("<f2", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Array::F32(v) => ("<f4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        Array::I32(v) => ("<i4", v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    };
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple}, }}");
    // Magic (6) + version (2) + length (2) + header, padded with spaces to 64 bytes, then '\n'.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&bytes);
    std::fs::write(path, out)
}

/// The values of a `.npy` file of f16, f32 or f64 elements, widened to f32.
pub fn read_f32(path: &Path) -> Result<Vec<f32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let bad = |why: &str| format!("`{}` is no .npy array this reads: {why}", path.display());
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("no NumPy magic"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        _ => return Err(bad("an unknown version")),
    };
    let header = bytes
        .get(start..start + len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| bad("a truncated header"))?;
    if header.contains("'fortran_order': True") {
        return Err(bad("Fortran order"));
    }
    let data = &bytes[start + len..];
    let each = |n: usize| data.chunks_exact(n);
    if header.contains("'<f2'") {
        Ok(each(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect())
    } else if header.contains("'<f4'") {
        Ok(each(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect())
    } else if header.contains("'<f8'") {
        Ok(each(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32)
            .collect())
    } else {
        Err(bad("elements other than little-endian f16, f32 or f64"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A written array reads back with its values, its header padded to 64 bytes as NumPy's.
    #[test]
    fn an_array_round_trips() {
        let dir = std::env::temp_dir().join(format!("moek-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npy");
        let v: Vec<f16> = [1.5f32, -2.0, 0.25].map(f16::from_f32).to_vec();
        write(&path, Array::F16(&v), &[1, 3]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!((bytes.len() - 3 * 2) % 64, 0);
        assert_eq!(read_f32(&path).unwrap(), vec![1.5, -2.0, 0.25]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
