//! Data loaders on good and bad files (CSV, `.npy`, and the image formats:
//! `.npy` images, IDX, CIFAR-10): errors name the file, line and column
//! where the format has them, and no input makes them panic.

use std::io::Write;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use training::data::{
    ImageLayout, ImageShape, Task, TaskKind, digits, load_cifar10, load_csv, load_idx,
    load_npy_images, load_npy_pair, parse_cifar10, parse_idx, parse_npy, split,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

fn npy(descr: &str, shape: &str, body: &[u8]) -> Vec<u8> {
    npy_order(descr, false, shape, body)
}

fn npy_order(descr: &str, fortran: bool, shape: &str, body: &[u8]) -> Vec<u8> {
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn csv_classification_with_text_labels() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "iris.csv",
        b"a,b,species\n1.0,2,setosa\n3,4.5,virginica\n\n5,6,setosa\n",
    );
    let d = load_csv(&p, "species", TaskKind::Classification).unwrap();
    assert_eq!((d.rows, d.features), (3, 2));
    assert_eq!(d.x, vec![1.0, 2.0, 3.0, 4.5, 5.0, 6.0]);
    assert_eq!(d.y, vec![0.0, 1.0, 0.0]);
    assert_eq!(d.classes, vec!["setosa", "virginica"]);
    assert_eq!(d.task, Task::Classification { classes: 2 });
}

#[test]
fn csv_target_in_the_middle_and_numeric_class_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "d.csv",
        b"x1,label,x2\n0.5,10,1\n0.25,9,2\n1,10,3\n",
    );
    let d = load_csv(&p, "label", TaskKind::Classification).unwrap();
    assert_eq!(d.classes, vec!["9", "10"]);
    assert_eq!(d.y, vec![1.0, 0.0, 1.0]);
    assert_eq!(d.x, vec![0.5, 1.0, 0.25, 2.0, 1.0, 3.0]);
    let r = load_csv(&p, "label", TaskKind::Regression).unwrap();
    assert_eq!(r.y, vec![10.0, 9.0, 10.0]);
}

#[test]
fn bad_csv_files_name_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[u8], &str, TaskKind, &str)] = &[
        (
            b"a,b,y\n1,2,0\n3,oops,1\n",
            "y",
            TaskKind::Classification,
            "bad.csv:3:2: expected a finite number in feature column 'b', found 'oops'",
        ),
        (
            b"a,b,y\n1,2,0\n3,4\n",
            "y",
            TaskKind::Classification,
            "bad.csv:3: expected 3 fields",
        ),
        (
            b"a,b,y\n1,2,0\n",
            "target",
            TaskKind::Classification,
            "bad.csv:1: no column named 'target'",
        ),
        (
            b"",
            "y",
            TaskKind::Classification,
            "bad.csv:1: the file is empty",
        ),
        (
            b"a,y\n",
            "y",
            TaskKind::Regression,
            "bad.csv:1: the file has a header but no data rows",
        ),
        (
            b"a,y\n1,x\n",
            "y",
            TaskKind::Regression,
            "bad.csv:2:2: expected a finite number as regression target 'y'",
        ),
        (
            b"a,y\n1,0\n2,0\n",
            "y",
            TaskKind::Classification,
            "at least 2 classes",
        ),
        (
            b"a,y\n1,0\nNaN,1\n",
            "y",
            TaskKind::Classification,
            "bad.csv:3:1: expected a finite number",
        ),
        (
            b"a,y\n1,0\n\xff,1\n",
            "y",
            TaskKind::Classification,
            "bad.csv:3:1: not valid UTF-8",
        ),
        (
            b"y\n1\n",
            "y",
            TaskKind::Classification,
            "no feature columns",
        ),
        (
            b"a,price\n1,2.5\n2,3\n",
            "price",
            TaskKind::Classification,
            "bad.csv:1:2: 'price' looks like a continuous target for classification \
             (it has fractional values such as 2.5); for a numeric target set task = \"regression\"",
        ),
    ];
    for (bytes, target, kind, want) in cases {
        let p = write(dir.path(), "bad.csv", bytes);
        let err = load_csv(&p, target, *kind).unwrap_err().to_string();
        assert!(
            err.contains(want),
            "{:?}: got {err}, want it to contain {want}",
            String::from_utf8_lossy(bytes)
        );
    }
    // Integer targets with a distinct value every few rows are prices, not classes.
    let many: String = (0..200)
        .map(|i| format!("{i},{}\n", 1000 + i * 7))
        .collect();
    let p = write(dir.path(), "many.csv", format!("a,y\n{many}").as_bytes());
    let err = load_csv(&p, "y", TaskKind::Classification)
        .unwrap_err()
        .to_string();
    assert!(err.contains("200 distinct values in 200 rows"), "{err}");
    assert!(load_csv(&p, "y", TaskKind::Regression).is_ok());
    // Many rows per class stay a classification.
    let labelled: String = (0..400).map(|i| format!("{i},{}\n", i % 60)).collect();
    let p = write(
        dir.path(),
        "labelled.csv",
        format!("a,y\n{labelled}").as_bytes(),
    );
    let d = load_csv(&p, "y", TaskKind::Classification).unwrap();
    assert_eq!(d.task, Task::Classification { classes: 60 });
    let err = load_csv(&dir.path().join("missing.csv"), "y", TaskKind::Regression)
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.csv"), "{err}");
}

#[test]
fn npy_pairs_in_several_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let xp = write(dir.path(), "x.npy", &npy("<f4", "(3, 2)", &x));
    let y: Vec<u8> = [0i64, 1, 1].iter().flat_map(|v| v.to_le_bytes()).collect();
    let yp = write(dir.path(), "y.npy", &npy("<i8", "(3,)", &y));
    let d = load_npy_pair(&xp, &yp, TaskKind::Classification).unwrap();
    assert_eq!(
        (d.rows, d.features, d.task),
        (3, 2, Task::Classification { classes: 2 })
    );
    assert_eq!(d.x, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y64: Vec<u8> = [0.5f64, 1.5, 2.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let yp = write(dir.path(), "y64.npy", &npy("<f8", "(3, 1)", &y64));
    let r = load_npy_pair(&xp, &yp, TaskKind::Regression).unwrap();
    assert_eq!(r.y, vec![0.5, 1.5, 2.5]);
    // Fortran order is transposed into C order.
    let arr = parse_npy(&npy_order("<f4", true, "(3, 2)", &x), Path::new("f.npy")).unwrap();
    assert_eq!(arr.data, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn bad_npy_files_say_what_is_wrong() {
    let body: Vec<u8> = [1.0f32; 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"PK\x03\x04 not numpy".to_vec(), "magic"),
        (npy("<f4", "(3, 2)", &body), "truncated"),
        (npy(">f4", "(2, 2)", &body), "unsupported dtype '>f4'"),
        (npy("<f4", "(2, x)", &body), "bad 'shape'"),
        (npy("<c8", "(2,)", &body), "unsupported dtype"),
        (b"\x93NUMPY\x01\x00\xff\x00{".to_vec(), "truncated"),
    ];
    for (bytes, want) in cases {
        let err = parse_npy(&bytes, Path::new("bad.npy"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("bad.npy: ") && err.contains(want),
            "got {err}, want {want}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let xp = write(dir.path(), "x.npy", &npy("<f4", "(2, 2)", &body));
    let yp = write(dir.path(), "y.npy", &npy("<f4", "(3,)", &body));
    let err = load_npy_pair(&xp, &yp, TaskKind::Regression)
        .unwrap_err()
        .to_string();
    assert!(err.contains("must have 2 rows"), "{err}");
    let yp = write(
        dir.path(),
        "y.npy",
        &npy(
            "<f4",
            "(2,)",
            &[0.5f32, 1.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        ),
    );
    let err = load_npy_pair(&xp, &yp, TaskKind::Classification)
        .unwrap_err()
        .to_string();
    assert!(err.contains("integers"), "{err}");
}

#[test]
fn split_is_seeded_stratified_and_standardised_on_train_only() {
    let d = digits();
    let a = split(&d, 0.2, 3).unwrap();
    assert_eq!(a, split(&d, 0.2, 3).unwrap());
    assert_ne!(a.val_y, split(&d, 0.2, 4).unwrap().val_y);
    assert_eq!(a.n_train + a.n_val, 1797);
    let mut val_counts = [0usize; 10];
    a.val_y.iter().for_each(|&l| val_counts[l as usize] += 1);
    let mut all_counts = [0usize; 10];
    d.labels().for_each(|l| all_counts[l] += 1);
    for c in 0..10 {
        let want = all_counts[c] as f64 * 0.2;
        assert!(
            (val_counts[c] as f64 - want).abs() <= 1.0,
            "class {c}: {} of {}",
            val_counts[c],
            all_counts[c]
        );
    }
    // Training columns have mean 0 and std 1 (or are constant), validation columns only roughly.
    for f in 0..64 {
        let col: Vec<f64> = a
            .train_x
            .iter()
            .skip(f)
            .step_by(64)
            .map(|&v| v as f64)
            .collect();
        let mean = col.iter().sum::<f64>() / col.len() as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64;
        assert!(mean.abs() < 1e-4, "feature {f} mean {mean}");
        assert!(
            (var - 1.0).abs() < 1e-3 || var < 1e-9,
            "feature {f} var {var}"
        );
    }
    assert!(split(&d, 1.5, 0).is_err());
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `n` images of `c x h x w` whose pixel value encodes (image, y, x, channel).
fn pixel(i: usize, y: usize, x: usize, ch: usize) -> f32 {
    (i * 1000 + y * 100 + x * 10 + ch) as f32
}

#[test]
fn npy_images_in_either_layout_load_channels_last() {
    let dir = tempfile::tempdir().unwrap();
    let (n, c, h, w) = (4, 3, 2, 5);
    let mut nchw = Vec::new();
    let mut nhwc = Vec::new();
    for i in 0..n {
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    nchw.push(pixel(i, y, x, ch));
                }
            }
        }
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    nhwc.push(pixel(i, y, x, ch));
                }
            }
        }
    }
    let labels = write(
        dir.path(),
        "y.npy",
        &npy(
            "<i8",
            "(4,)",
            &[0i64, 1, 1, 0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        ),
    );
    let a = write(
        dir.path(),
        "a.npy",
        &npy("<f4", "(4, 3, 2, 5)", &f32_bytes(&nchw)),
    );
    let b = write(
        dir.path(),
        "b.npy",
        &npy("<f4", "(4, 2, 5, 3)", &f32_bytes(&nhwc)),
    );
    let from_nchw = load_npy_images(&a, &labels, ImageLayout::Nchw).unwrap();
    let from_nhwc = load_npy_images(&b, &labels, ImageLayout::Nhwc).unwrap();
    assert_eq!(from_nchw.image, Some(ImageShape { h, w, c }));
    assert_eq!(from_nchw.x, nhwc, "NCHW is transposed to channels last");
    assert_eq!(from_nchw.x, from_nhwc.x);
    assert_eq!(from_nhwc.y, vec![0.0, 1.0, 1.0, 0.0]);
    // A 2-D array is not images; the error says which layout was expected.
    let flat = write(
        dir.path(),
        "flat.npy",
        &npy("<f4", "(4, 30)", &f32_bytes(&nhwc)),
    );
    let err = load_npy_images(&flat, &labels, ImageLayout::Nchw)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("flat.npy") && err.contains("4-D") && err.contains("NCHW"),
        "{err}"
    );
}

fn idx(dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend(d.to_be_bytes());
    }
    out.extend(body);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn idx_files_load_gzipped_or_not() {
    let dir = tempfile::tempdir().unwrap();
    let (n, h, w) = (3usize, 4usize, 2usize);
    let px: Vec<u8> = (0..n * h * w).map(|i| (i * 7 % 256) as u8).collect();
    let images = idx(&[n as u32, h as u32, w as u32], &px);
    let labels = idx(&[n as u32], &[2, 0, 1]);
    let plain = load_idx(
        &write(dir.path(), "x-idx3-ubyte", &images),
        &write(dir.path(), "y-idx1-ubyte", &labels),
    )
    .unwrap();
    let zipped = load_idx(
        &write(dir.path(), "x.gz", &gzip(&images)),
        &write(dir.path(), "y.gz", &gzip(&labels)),
    )
    .unwrap();
    assert_eq!(plain.image, Some(ImageShape { h, w, c: 1 }));
    assert_eq!(plain.x, px.iter().map(|&v| v as f32).collect::<Vec<_>>());
    assert_eq!(plain.y, vec![2.0, 0.0, 1.0]);
    assert_eq!(plain.task, Task::Classification { classes: 3 });
    assert_eq!((plain.x, plain.y), (zipped.x, zipped.y));

    let short = write(
        dir.path(),
        "short",
        &idx(&[n as u32, h as u32, w as u32], &px[1..]),
    );
    let y = write(dir.path(), "y", &labels);
    let err = load_idx(&short, &y).unwrap_err().to_string();
    assert!(err.contains("short") && err.contains("holds 23"), "{err}");
    let two = write(dir.path(), "two", &idx(&[2], &[0, 1]));
    let x = write(dir.path(), "x", &images);
    let err = load_idx(&x, &two).unwrap_err().to_string();
    assert!(err.contains("3 values to match"), "{err}");
    let floats = write(dir.path(), "f", &[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0]);
    let err = load_idx(&floats, &y).unwrap_err().to_string();
    assert!(err.contains("0x0d is not supported"), "{err}");
}

fn cifar_record(label: u8, seed: usize) -> Vec<u8> {
    let mut r = vec![label];
    r.extend((0..3072).map(|i| ((i + seed) % 251) as u8));
    r
}

#[test]
fn cifar10_batches_load_from_a_file_or_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let one: Vec<u8> = [cifar_record(3, 0), cifar_record(9, 5)].concat();
    let two: Vec<u8> = cifar_record(0, 9);
    write(dir.path(), "data_batch_1.bin", &one);
    write(dir.path(), "data_batch_2.bin", &two);
    write(dir.path(), "test_batch.bin", &cifar_record(1, 1));
    let all = load_cifar10(dir.path()).unwrap();
    assert_eq!(all.rows, 3, "training batches only, in name order");
    assert_eq!(all.y, vec![3.0, 9.0, 0.0]);
    assert_eq!(all.image, Some(ImageShape { h: 32, w: 32, c: 3 }));
    assert_eq!(all.classes[3], "cat");
    // Pixel (y, x) of channel ch sits at ch * 1024 + y * 32 + x in the record.
    let (y, x, ch) = (5usize, 7usize, 2usize);
    assert_eq!(
        all.x[(y * 32 + x) * 3 + ch],
        one[1 + ch * 1024 + y * 32 + x] as f32
    );
    let single = load_cifar10(&dir.path().join("data_batch_2.bin")).unwrap();
    assert_eq!(single.rows, 1);

    let bad = write(dir.path(), "bad.bin", &one[..3000]);
    let err = load_cifar10(&bad).unwrap_err().to_string();
    assert!(
        err.contains("bad.bin") && err.contains("3073-byte records"),
        "{err}"
    );
    let label = write(dir.path(), "label.bin", &cifar_record(10, 0));
    let err = load_cifar10(&label).unwrap_err().to_string();
    assert!(err.contains("label 10"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    let err = load_cifar10(empty.path()).unwrap_err().to_string();
    assert!(err.contains("data_batch_"), "{err}");
}

#[test]
fn images_are_standardised_per_channel_on_the_training_split() {
    let ds = training::data::synthetic_images(60, ImageShape { h: 4, w: 5, c: 3 }, 3, 1);
    let s = split(&ds, 0.25, 0).unwrap();
    assert_eq!(s.image, ds.image);
    for ch in 0..3 {
        let vals: Vec<f64> = s
            .train_x
            .iter()
            .skip(ch)
            .step_by(3)
            .map(|&v| v as f64)
            .collect();
        let mean = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64;
        assert!(
            mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3,
            "channel {ch}: mean {mean} var {var}"
        );
    }
    // Every pixel of a channel shares the channel's statistics.
    assert!(
        s.feature_mean
            .chunks(3)
            .all(|px| px == &s.feature_mean[..3])
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn csv_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = training::data::parse_csv(&bytes[..], Path::new("f.csv"), "y", TaskKind::Classification);
        let _ = training::data::parse_csv(&bytes[..], Path::new("f.csv"), "y", TaskKind::Regression);
    }

    #[test]
    fn csv_parser_never_panics_on_csv_like_text(text in "[a-y0-9.,\\n -]{0,200}") {
        let with_header = format!("a,y\n{text}");
        let _ = training::data::parse_csv(with_header.as_bytes(), Path::new("f.csv"), "y", TaskKind::Classification);
    }

    #[test]
    fn npy_parser_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..200), cut in 0usize..140) {
        let mut bytes = npy("<f4", "(3, 2)", &tail);
        bytes.truncate(cut.max(1) + tail.len());
        let _ = parse_npy(&bytes, Path::new("f.npy"));
        let _ = parse_npy(&tail, Path::new("f.npy"));
    }

    #[test]
    fn idx_parser_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..200), dims in proptest::collection::vec(0u32..6, 1..4), zip in any::<bool>()) {
        let mut bytes = idx(&dims, &tail);
        if zip {
            bytes = gzip(&bytes);
        }
        let _ = parse_idx(bytes, Path::new("f.idx"));
        let _ = parse_idx(tail.clone(), Path::new("f.idx"));
        let _ = parse_idx(gzip(&tail)[..tail.len().min(10)].to_vec(), Path::new("f.gz"));
    }

    #[test]
    fn cifar10_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..7000)) {
        let _ = parse_cifar10(&bytes, Path::new("b.bin"));
    }
}
