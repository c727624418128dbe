//! pack_files on small Parquet inputs written here: determinism across thread counts and
//! located errors.

use arrow::array::{ArrayRef, ListArray, RecordBatch};
use arrow::datatypes::Int64Type;
use parquet::arrow::ArrowWriter;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokpack_core::io::{pack_files, parse_compression, LabelSource, PackFilesConfig, Progress};
use tokpack_core::{pool, CoreError, PlanConfig};

fn write_input(path: &Path, rows: &[Vec<i64>]) {
    let ids: ListArray = ListArray::from_iter_primitive::<Int64Type, _, _>(
        rows.iter().map(|r| Some(r.iter().map(|&v| Some(v)))),
    );
    let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(ids) as ArrayRef)]).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn config(dir: &Path, inputs: Vec<PathBuf>, name: &str) -> PackFilesConfig {
    let out = dir.join(name);
    let spill = dir.join(format!("{name}-spill"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&spill).unwrap();
    PackFilesConfig {
        paths: inputs,
        out_dir: out,
        spill_dir: spill,
        tokens_column: "input_ids".into(),
        labels: LabelSource::None,
        plan: PlanConfig::new(16, "bfd", "split", 0).unwrap(),
        rows_per_shard: 3,
        row_group_rows: 2,
        compression: parse_compression("zstd").unwrap(),
        batch_rows: 2,
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tokpack-io-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn output_bytes_do_not_depend_on_threads() {
    let dir = temp_dir("threads");
    let rows: Vec<Vec<i64>> = (0..40).map(|i| (0..(i * 7 % 23)).collect()).collect();
    write_input(&dir.join("a.parquet"), &rows);
    let inputs = vec![dir.join("a.parquet")];
    let mut outs = Vec::new();
    for threads in [1, 2] {
        let cfg = config(&dir, inputs.clone(), &format!("out{threads}"));
        let outcome = pool::install(Some(threads), || pack_files(&cfg, &Progress::new())).unwrap();
        assert_eq!(outcome.input_rows, vec![40]);
        assert!(outcome.shards.len() > 1);
        outs.push((cfg.out_dir.clone(), outcome.shards));
    }
    for (a, b) in outs[0].1.iter().zip(&outs[1].1) {
        assert_eq!(a.checksum, b.checksum);
        let bytes = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
        assert_eq!(bytes(&outs[0].0, &a.file), bytes(&outs[1].0, &b.file));
        assert_eq!(bytes(&outs[0].0, &a.index), bytes(&outs[1].0, &b.index));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn negative_token_is_located() {
    let dir = temp_dir("neg");
    write_input(&dir.join("b.parquet"), &[vec![1, 2], vec![3, -4]]);
    let cfg = config(&dir, vec![dir.join("b.parquet")], "out");
    let err = match pool::install(Some(1), || pack_files(&cfg, &Progress::new())) {
        Ok(_) => panic!("a negative token id was accepted"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(matches!(err, CoreError::Data(_)), "{msg}");
    assert!(
        msg.contains("b.parquet, row group 0, row 1, column \"input_ids\""),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
