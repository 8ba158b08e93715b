//! NumPy `.npy` files (format versions 1 to 3), read without NumPy.

use std::path::Path;

use super::{Dataset, Task, TaskKind};
use crate::error::{Result, WorkerError};

/// A decoded array, converted to `f32`, in C order.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub fn load_npy(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|source| WorkerError::Io {
        path: path.into(),
        source,
    })?;
    parse_npy(&bytes, path)
}

/// Decodes `.npy` bytes; `path` only names the source in errors.
pub fn parse_npy(bytes: &[u8], path: &Path) -> Result<NpyArray> {
    let err = |msg: String| WorkerError::data(path, None, None, msg);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(err(
            "not a .npy file: the magic string \\x93NUMPY is missing".into(),
        ));
    }
    let (header_len, start): (usize, usize) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(err(format!("unsupported .npy format version {v}"))),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| err("the header is truncated".into()))?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| err("the header is not text".into()))?;
    let descr = dict_value(header, "descr")
        .ok_or_else(|| err(format!("the header has no 'descr': {header}")))?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let fortran = match dict_value(header, "fortran_order") {
        Some("True") => true,
        Some("False") => false,
        _ => return Err(err("the header has no valid 'fortran_order'".into())),
    };
    let shape_text =
        dict_value(header, "shape").ok_or_else(|| err("the header has no 'shape'".into()))?;
    let shape = parse_shape(shape_text)
        .ok_or_else(|| err(format!("bad 'shape' in the header: {shape_text}")))?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err("the shape overflows".into()))?;
    let (width, decode) = decoder(descr).ok_or_else(|| {
        err(format!(
            "unsupported dtype '{descr}'; expected a little-endian int, uint, float or bool"
        ))
    })?;
    let body = &bytes[end..];
    let need = count
        .checked_mul(width)
        .ok_or_else(|| err("the shape overflows".into()))?;
    if body.len() < need {
        return Err(err(format!(
            "the data is truncated: shape {shape:?} needs {need} bytes, found {}",
            body.len()
        )));
    }
    let mut data: Vec<f32> = body[..need].chunks_exact(width).map(decode).collect();
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Err(err(format!("element {i} is not a finite number")));
    }
    if fortran && shape.len() == 2 {
        let (r, c) = (shape[0], shape[1]);
        data = (0..r * c).map(|i| data[(i % c) * r + i / c]).collect();
    } else if fortran && shape.len() > 2 {
        return Err(err(
            "Fortran-ordered arrays of more than 2 dimensions are not supported".into(),
        ));
    }
    Ok(NpyArray { shape, data })
}

/// The raw text of `key`'s value in a Python dict literal.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = header[at + key.len() + 2..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else {
        rest.find([',', '}'])?
    };
    Some(rest[..end].trim())
}

fn parse_shape(s: &str) -> Option<Vec<usize>> {
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().ok())
        .collect()
}

type Decode = fn(&[u8]) -> f32;

fn decoder(descr: &str) -> Option<(usize, Decode)> {
    Some(match descr {
        "<f4" => (4, |b| f32::from_le_bytes(b.try_into().unwrap())),
        "<f8" => (8, |b| f64::from_le_bytes(b.try_into().unwrap()) as f32),
        "<i8" => (8, |b| i64::from_le_bytes(b.try_into().unwrap()) as f32),
        "<i4" => (4, |b| i32::from_le_bytes(b.try_into().unwrap()) as f32),
        "<i2" => (2, |b| i16::from_le_bytes(b.try_into().unwrap()) as f32),
        "|i1" => (1, |b| b[0] as i8 as f32),
        "<u8" => (8, |b| u64::from_le_bytes(b.try_into().unwrap()) as f32),
        "<u4" => (4, |b| u32::from_le_bytes(b.try_into().unwrap()) as f32),
        "<u2" => (2, |b| u16::from_le_bytes(b.try_into().unwrap()) as f32),
        "|u1" | "|b1" => (1, |b| b[0] as f32),
        _ => return None,
    })
}

/// A data set from a 2-D feature array and a 1-D (or `rows x 1`) target array.
pub fn load_npy_pair(x_path: &Path, y_path: &Path, kind: TaskKind) -> Result<Dataset> {
    dataset_from_arrays(load_npy(x_path)?, load_npy(y_path)?, x_path, y_path, kind)
}

/// A data set from a decoded 2-D feature array and its targets (see
/// [`load_npy_pair`]); the paths name the arrays in errors.
pub(crate) fn dataset_from_arrays(
    x: NpyArray,
    y: NpyArray,
    x_path: &Path,
    y_path: &Path,
    kind: TaskKind,
) -> Result<Dataset> {
    let err = |p: &Path, msg: String| WorkerError::data(p, None, None, msg);
    if x.shape.len() != 2 || x.shape[1] == 0 {
        return Err(err(
            x_path,
            format!(
                "features must be a 2-D array with at least one column, found shape {:?}",
                x.shape
            ),
        ));
    }
    let rows = x.shape[0];
    let tcols = match y.shape.as_slice() {
        [r] if *r == rows => 1,
        [r, c] if *r == rows && *c >= 1 => *c,
        s => {
            return Err(err(
                y_path,
                format!("targets must have {rows} rows to match the features, found shape {s:?}"),
            ));
        }
    };
    if rows == 0 {
        return Err(err(x_path, "the array has no rows".into()));
    }
    let name = format!("npy:{}:{}", x_path.display(), y_path.display());
    let (task, classes) = match kind {
        TaskKind::Regression => (Task::Regression { targets: tcols }, Vec::new()),
        TaskKind::Classification => {
            if tcols != 1 {
                return Err(err(
                    y_path,
                    format!("class labels must be one column, found {tcols}"),
                ));
            }
            if let Some(bad) = y
                .data
                .iter()
                .find(|v| **v < 0.0 || v.fract() != 0.0 || **v > 1e6)
            {
                return Err(err(
                    y_path,
                    format!(
                        "class labels must be integers 0..n, found {bad}; \
                         for a continuous target set task = \"regression\" in [data]"
                    ),
                ));
            }
            let n = y.data.iter().fold(0.0f32, |m, &v| m.max(v)) as usize + 1;
            if n < 2 {
                return Err(err(
                    y_path,
                    "classification needs at least 2 classes".into(),
                ));
            }
            (
                Task::Classification { classes: n },
                (0..n).map(|c| c.to_string()).collect(),
            )
        }
    };
    Ok(Dataset {
        name,
        rows,
        features: x.shape[1],
        image: None,
        x: x.data,
        y: y.data,
        task,
        classes,
    })
}
