//! Image data sets: `.npy` arrays of images, the IDX files of MNIST and
//! Fashion-MNIST (gzipped or not), and CIFAR-10's binary batches.
//!
//! Every loader returns images channels-last (HWC), one per row, with
//! [`Dataset::image`] set. Like the other loaders they never panic on bad
//! input: a malformed file is a [`WorkerError::Data`] naming it.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::npy::{NpyArray, dataset_from_arrays, load_npy};
use super::{Dataset, ImageShape, Task, TaskKind};
use crate::error::{Result, WorkerError};

/// How a 4-D `.npy` array orders an image's axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageLayout {
    /// images x channels x height x width (PyTorch's order).
    Nchw,
    /// images x height x width x channels (TensorFlow's order).
    Nhwc,
}

impl ImageLayout {
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "NCHW" => Some(ImageLayout::Nchw),
            "NHWC" => Some(ImageLayout::Nhwc),
            _ => None,
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| WorkerError::Io {
        path: path.into(),
        source,
    })
}

/// `n` images of `c x h x w` (channel planes) as HWC rows.
fn chw_to_hwc(data: &[f32], n: usize, c: usize, h: usize, w: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; data.len()];
    let plane = h * w;
    for i in 0..n {
        let (src, dst) = (
            &data[i * c * plane..][..c * plane],
            &mut out[i * c * plane..][..c * plane],
        );
        for ch in 0..c {
            for p in 0..plane {
                dst[p * c + ch] = src[ch * plane + p];
            }
        }
    }
    out
}

/// Classification images from a 4-D `.npy` array in `layout` and a 1-D
/// array of class labels.
pub fn load_npy_images(x_path: &Path, y_path: &Path, layout: ImageLayout) -> Result<Dataset> {
    let x = load_npy(x_path)?;
    let [n, a, b, c] = x.shape[..] else {
        return Err(WorkerError::data(
            x_path,
            None,
            None,
            format!(
                "images must be a 4-D array ({}), found shape {:?}",
                match layout {
                    ImageLayout::Nchw => "images x channels x height x width, layout = \"NCHW\"",
                    ImageLayout::Nhwc => "images x height x width x channels, layout = \"NHWC\"",
                },
                x.shape
            ),
        ));
    };
    let shape = match layout {
        ImageLayout::Nchw => ImageShape { c: a, h: b, w: c },
        ImageLayout::Nhwc => ImageShape { h: a, w: b, c },
    };
    if shape.is_empty() {
        return Err(WorkerError::data(
            x_path,
            None,
            None,
            format!("images of shape {:?} hold no pixels", x.shape),
        ));
    }
    let data = match layout {
        ImageLayout::Nchw => chw_to_hwc(&x.data, n, shape.c, shape.h, shape.w),
        ImageLayout::Nhwc => x.data,
    };
    let flat = NpyArray {
        shape: vec![n, shape.len()],
        data,
    };
    let mut ds = dataset_from_arrays(
        flat,
        load_npy(y_path)?,
        x_path,
        y_path,
        TaskKind::Classification,
    )?;
    ds.image = Some(shape);
    Ok(ds)
}

/// Decompresses gzip bytes (by their magic number); others pass through.
fn maybe_gunzip(bytes: Vec<u8>, path: &Path) -> Result<Vec<u8>> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| {
                WorkerError::data(path, None, None, format!("not a valid gzip file: {e}"))
            })?;
        Ok(out)
    } else {
        Ok(bytes)
    }
}

/// An IDX array of unsigned bytes (MNIST's format): its dimensions and values.
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Decodes IDX bytes (gzipped or not); `path` only names the source in errors.
pub fn parse_idx(bytes: Vec<u8>, path: &Path) -> Result<IdxArray> {
    let bytes = maybe_gunzip(bytes, path)?;
    let err = |msg: String| WorkerError::data(path, None, None, msg);
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(err(
            "not an IDX file: it must start with two zero bytes".into()
        ));
    }
    if bytes[2] != 0x08 {
        return Err(err(format!(
            "IDX type 0x{:02x} is not supported; MNIST's files hold unsigned bytes (0x08)",
            bytes[2]
        )));
    }
    let ndims = bytes[3] as usize;
    if ndims == 0 || ndims > 4 {
        return Err(err(format!(
            "an IDX array of {ndims} dimensions is not supported (1 to 4)"
        )));
    }
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(err("the header is truncated".into()));
    }
    let dims: Vec<usize> = (0..ndims)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize)
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| err("the dimensions overflow".into()))?;
    if bytes.len() - header != count {
        return Err(err(format!(
            "the header says {dims:?} ({count} values) but the file holds {}",
            bytes.len() - header
        )));
    }
    Ok(IdxArray {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// MNIST or Fashion-MNIST: an IDX file of `n x h x w` images and one of `n`
/// labels, each gzipped or not. Pixels keep their 0-255 values (the split
/// standardises them).
pub fn load_idx(images: &Path, labels: &Path) -> Result<Dataset> {
    let x = parse_idx(read(images)?, images)?;
    let y = parse_idx(read(labels)?, labels)?;
    let [n, h, w] = x.dims[..] else {
        return Err(WorkerError::data(
            images,
            None,
            None,
            format!(
                "images must be a 3-D IDX array (images x height x width), found {:?}",
                x.dims
            ),
        ));
    };
    if y.dims != [n] {
        return Err(WorkerError::data(
            labels,
            None,
            None,
            format!(
                "labels must be a 1-D IDX array of {n} values to match the images, found {:?}",
                y.dims
            ),
        ));
    }
    if n == 0 || h == 0 || w == 0 {
        return Err(WorkerError::data(
            images,
            None,
            None,
            "the file holds no pixels".to_string(),
        ));
    }
    labelled(
        format!("idx:{}:{}", images.display(), labels.display()),
        ImageShape { h, w, c: 1 },
        x.data.iter().map(|&v| v as f32).collect(),
        y.data,
        labels,
    )
}

/// A classification data set of HWC images and byte labels.
fn labelled(
    name: String,
    shape: ImageShape,
    x: Vec<f32>,
    labels: Vec<u8>,
    path: &Path,
) -> Result<Dataset> {
    let classes = labels.iter().copied().max().map_or(0, |m| m as usize + 1);
    if classes < 2 {
        return Err(WorkerError::data(
            path,
            None,
            None,
            "classification needs at least 2 classes".to_string(),
        ));
    }
    Ok(Dataset {
        name,
        rows: labels.len(),
        features: shape.len(),
        image: Some(shape),
        x,
        y: labels.iter().map(|&l| l as f32).collect(),
        task: Task::Classification { classes },
        classes: (0..classes).map(|c| c.to_string()).collect(),
    })
}

/// CIFAR-10's binary record: a label byte, then 1024 red, 1024 green and
/// 1024 blue bytes of a 32x32 image.
const CIFAR_SIDE: usize = 32;
const CIFAR_RECORD: usize = 1 + 3 * CIFAR_SIDE * CIFAR_SIDE;
const CIFAR_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// Decodes one CIFAR-10 binary batch: HWC pixels and labels.
pub fn parse_cifar10(bytes: &[u8], path: &Path) -> Result<(Vec<f32>, Vec<u8>)> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(CIFAR_RECORD) {
        return Err(WorkerError::data(
            path,
            None,
            None,
            format!(
                "a CIFAR-10 binary batch is a whole number of {CIFAR_RECORD}-byte records; this file has {} bytes",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / CIFAR_RECORD;
    let mut labels = Vec::with_capacity(n);
    let mut planes = Vec::with_capacity(n * (CIFAR_RECORD - 1));
    for (i, rec) in bytes.chunks_exact(CIFAR_RECORD).enumerate() {
        if rec[0] as usize >= CIFAR_CLASSES.len() {
            return Err(WorkerError::data(
                path,
                None,
                None,
                format!(
                    "record {i} has label {}, not a CIFAR-10 class (0-9)",
                    rec[0]
                ),
            ));
        }
        labels.push(rec[0]);
        planes.extend(rec[1..].iter().map(|&v| v as f32));
    }
    Ok((chw_to_hwc(&planes, n, 3, CIFAR_SIDE, CIFAR_SIDE), labels))
}

/// CIFAR-10 from its binary version: one batch file, or a directory whose
/// `data_batch_*.bin` files are read in name order.
pub fn load_cifar10(path: &Path) -> Result<Dataset> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut f: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| WorkerError::Io {
                path: path.into(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("data_batch_") && n.ends_with(".bin"))
            })
            .collect();
        f.sort();
        if f.is_empty() {
            return Err(WorkerError::data(
                path,
                None,
                None,
                "the directory has no data_batch_*.bin files (CIFAR-10's binary version)"
                    .to_string(),
            ));
        }
        f
    } else {
        vec![path.to_path_buf()]
    };
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for f in &files {
        let (px, labels) = parse_cifar10(&read(f)?, f)?;
        x.extend(px);
        y.extend(labels);
    }
    let shape = ImageShape {
        h: CIFAR_SIDE,
        w: CIFAR_SIDE,
        c: 3,
    };
    // The ten classes are CIFAR-10's, whichever a batch happens to hold.
    Ok(Dataset {
        name: format!("cifar10:{}", path.display()),
        rows: y.len(),
        features: shape.len(),
        image: Some(shape),
        x,
        y: y.iter().map(|&l| l as f32).collect(),
        task: Task::Classification {
            classes: CIFAR_CLASSES.len(),
        },
        classes: CIFAR_CLASSES.iter().map(|c| c.to_string()).collect(),
    })
}
