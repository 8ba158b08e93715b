//! A split data set resident on a device, shared by every trial that uses it.

use std::sync::Arc;

use kernels::{Backend, at_mut};

use crate::data::{SplitData, Task};
use crate::error::{Result, WorkerError};
use crate::lane::Lane;
use crate::model::ImageShape;

/// Training and validation parts on the device, uploaded once.
pub struct DeviceData<B: Backend> {
    pub name: String,
    pub task: Task,
    pub features: usize,
    /// The shape of each row, when rows are images (HWC).
    pub image: Option<ImageShape>,
    pub target_cols: usize,
    pub n_train: usize,
    pub n_val: usize,
    pub train_x: B::Buf,
    pub train_y: B::Buf,
    pub val_x: B::Buf,
    pub val_y: B::Buf,
    /// Standard deviation of each regression target, to report RMSE in
    /// original units.
    pub target_std: Vec<f32>,
    /// Total sum of squares of the validation targets, for R².
    pub val_sst: f64,
}

/// Every classification label is a class index: a whole number in `0..classes`.
pub fn check_labels(data: &SplitData) -> Result<()> {
    let Task::Classification { classes } = data.task else {
        return Ok(());
    };
    for (part, y) in [("training", &data.train_y), ("validation", &data.val_y)] {
        if let Some((row, bad)) = y
            .iter()
            .enumerate()
            .find(|(_, l)| !(**l >= 0.0 && **l < classes as f32 && l.fract() == 0.0))
        {
            return Err(WorkerError::Config(format!(
                "{}: {part} row {row} has label {bad}, not a class index below {classes}",
                data.name
            )));
        }
    }
    Ok(())
}

impl<B: Backend> DeviceData<B> {
    /// Uploads `data` after checking its labels: every backend's loss
    /// trusts them (a bad one is only counted there, see [`kernels::STATS_LEN`]).
    pub fn upload(lane: &mut Lane<B>, data: &SplitData) -> Result<Arc<Self>> {
        check_labels(data)?;
        let (b, ctx) = lane.device();
        let mut put = |v: &[f32]| -> Result<B::Buf> {
            let mut buf = b.alloc_zeroed(v.len())?;
            b.upload(ctx, v, at_mut(&mut buf, 0))?;
            Ok(buf)
        };
        let t = data.target_cols();
        let val_sst = (0..t)
            .map(|c| {
                let col = data.val_y.iter().skip(c).step_by(t).map(|&v| v as f64);
                let mean = col.clone().sum::<f64>() / data.n_val as f64;
                col.map(|v| (v - mean).powi(2)).sum::<f64>()
            })
            .sum();
        let data = DeviceData {
            name: data.name.clone(),
            task: data.task,
            features: data.features,
            image: data.image,
            target_cols: t,
            n_train: data.n_train,
            n_val: data.n_val,
            train_x: put(&data.train_x)?,
            train_y: put(&data.train_y)?,
            val_x: put(&data.val_x)?,
            val_y: put(&data.val_y)?,
            target_std: data.target_std.clone(),
            val_sst,
        };
        // Every lane reads the data, each on its own stream: the copies must
        // have landed before any of them starts.
        lane.sync()?;
        Ok(Arc::new(data))
    }

    /// Device bytes of the data set.
    pub fn bytes(&self) -> usize {
        4 * (self.n_train + self.n_val) * (self.features + self.target_cols)
    }
}
