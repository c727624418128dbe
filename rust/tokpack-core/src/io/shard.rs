//! One packed shard from samples held in memory: the shard tasks of `tokpack.ray` receive the
//! plan rows of their shard and the samples those rows use, and write them with the same
//! writer as [`super::pack_files`], so the shard's bytes are those `pack_files` writes.

use super::carry::Carried;
use super::progress::Progress;
use super::writer::{write_shard, SampleSource, ShardContext, ShardInfo, ShardOut};
use crate::error::{CoreError, Result};
use crate::plan::Plan;
use parquet::basic::Compression;
use std::path::Path;

/// Samples as flat values: sample `ids[i]` holds `tokens[offsets[i]..offsets[i + 1]]` (and the
/// same span of `labels`); `ids` ascending.
pub struct HeldSamples<'a> {
    pub ids: &'a [i64],
    pub offsets: &'a [i64],
    pub tokens: &'a [i32],
    pub labels: Option<&'a [i32]>,
}

impl HeldSamples<'_> {
    fn span(&self, sample: i64, start: i64, len: usize) -> Result<std::ops::Range<usize>> {
        let i = self
            .ids
            .binary_search(&sample)
            .map_err(|_| CoreError::data(format!("sample {sample} was not sent to this shard")))?;
        let a = (self.offsets[i] + start) as usize;
        if a + len > self.offsets[i + 1] as usize {
            return Err(CoreError::data(format!(
                "sample {sample} has fewer tokens than its plan segment"
            )));
        }
        Ok(a..a + len)
    }

    fn check(&self) -> Result<()> {
        let n = self.ids.len();
        let last = self.offsets.last().copied().unwrap_or(-1);
        let sorted = self.ids.windows(2).all(|w| w[0] < w[1]);
        let offsets_ok =
            self.offsets.first() == Some(&0) && self.offsets.windows(2).all(|w| w[0] <= w[1]);
        let labels_ok = self.labels.iter().all(|l| l.len() == self.tokens.len());
        if self.offsets.len() != n + 1
            || !sorted
            || !offsets_ok
            || last as usize != self.tokens.len()
            || !labels_ok
        {
            return Err(CoreError::Config(
                "held samples: ids must ascend, offsets must start at 0, ascend and end at the \
                 token count, and labels must match the tokens"
                    .into(),
            ));
        }
        Ok(())
    }
}

// Held samples are plain sequences: `seq` is always 0 (shard tasks write no pairs).
impl SampleSource for HeldSamples<'_> {
    fn read(
        &self,
        sample: i64,
        _seq: u8,
        start: i64,
        tokens: &mut [i32],
        labels: Option<&mut [i32]>,
    ) -> Result<()> {
        let span = self.span(sample, start, tokens.len())?;
        tokens.copy_from_slice(&self.tokens[span.clone()]);
        if let (Some(out), Some(held)) = (labels, self.labels) {
            out.copy_from_slice(&held[span]);
        }
        Ok(())
    }
}

/// Writes shard `shard` into `dir` from `rows`, a plan holding exactly the shard's rows (its
/// segments keep their global sample ids), gathering tokens from `samples` and the carried
/// columns' values from `carried` (each with the held `ids`), in the row groups and compression
/// of a `PackConfig` (checked when it was made).
pub fn write_held_shard(
    dir: &Path,
    shard: usize,
    rows: &Plan,
    samples: &HeldSamples,
    carried: &[Carried],
    row_group_rows: usize,
    compression: Compression,
) -> Result<ShardInfo> {
    samples.check()?;
    let ctx = ShardContext {
        out: ShardOut {
            dir,
            row_group_rows,
            compression,
            progress: &Progress::new(),
        },
        plan: rows,
        source: samples,
        has_labels: samples.labels.is_some(),
        pairs: None,
        carried,
    };
    write_shard(&ctx, shard, 0..rows.n_bins())
}
