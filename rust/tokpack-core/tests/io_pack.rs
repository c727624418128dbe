//! pack_files on small Parquet inputs written here: determinism across thread counts, located
//! errors, and the recorded byte ranges and checksums that readers check.

use arrow::array::{ArrayRef, ListArray, RecordBatch};
use arrow::datatypes::Int64Type;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokpack_core::config::PackFields;
use tokpack_core::io::{
    file_checksum, pack_files, read_checked_row_group, GroupCheck, PackFilesConfig, Progress,
};
use tokpack_core::{pool, CoreError, PackConfig};

fn write_input(path: &Path, rows: &[Vec<i64>]) {
    write_row_groups(path, rows, 1 << 20);
}

fn write_row_groups(path: &Path, rows: &[Vec<i64>], row_group_rows: usize) {
    let ids: ListArray = ListArray::from_iter_primitive::<Int64Type, _, _>(
        rows.iter().map(|r| Some(r.iter().map(|&v| Some(v)))),
    );
    let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(ids) as ArrayRef)]).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(row_group_rows))
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn config(dir: &Path, inputs: Vec<PathBuf>, name: &str) -> PackFilesConfig {
    let out = dir.join(name);
    let spill = dir.join(format!("{name}-spill"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&spill).unwrap();
    let fields = PackFields {
        overlong: "split".into(),
        row_order: "plan".into(),
        labels_column: None,
        rows_per_shard: 3,
        row_group_rows: 2,
        ..PackFields::defaults(16)
    };
    PackFilesConfig {
        paths: inputs,
        out_dir: out,
        spill_dir: spill,
        config: PackConfig::new(fields).unwrap(),
        batch_rows: 2,
        kind: tokpack_core::SampleKind::Sft,
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tokpack-io-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Packs `rows` (written in row groups of `row_group_rows`) once per thread count and checks
/// that every output file is byte-identical.
fn assert_same_bytes(tag: &str, rows: &[Vec<i64>], row_group_rows: usize, threads: &[usize]) {
    let dir = temp_dir(tag);
    write_row_groups(&dir.join("a.parquet"), rows, row_group_rows);
    let inputs = vec![dir.join("a.parquet")];
    let mut outs = Vec::new();
    for &threads in threads {
        let cfg = config(&dir, inputs.clone(), &format!("out{threads}"));
        let outcome = pool::install(Some(threads), || pack_files(&cfg, &Progress::new())).unwrap();
        assert_eq!(outcome.input_rows, vec![rows.len() as u64]);
        assert!(outcome.shards.len() > 1);
        outs.push((cfg.out_dir.clone(), outcome.shards));
    }
    for other in &outs[1..] {
        assert_eq!(outs[0].1.len(), other.1.len());
        for (a, b) in outs[0].1.iter().zip(&other.1) {
            assert_eq!(a.checksum, b.checksum);
            let bytes = |d: &Path, f: &str| std::fs::read(d.join(f)).unwrap();
            assert_eq!(bytes(&outs[0].0, &a.file), bytes(&other.0, &b.file));
            assert_eq!(bytes(&outs[0].0, &a.index), bytes(&other.0, &b.index));
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn output_bytes_do_not_depend_on_threads() {
    let rows: Vec<Vec<i64>> = (0..40).map(|i| (0..(i * 7 % 23)).collect()).collect();
    assert_same_bytes("threads", &rows, 1 << 20, &[1, 2]);
}

/// More than 256 threads: the spill location once kept the worker in 8 bits, so workers 256 and
/// up read another worker's tokens (wrong output, exit 0). 1,000 one-row units keep every
/// thread busy enough that some thread above 255 appends.
#[test]
fn output_bytes_are_the_same_above_256_threads() {
    let rows: Vec<Vec<i64>> = (0..1000i64)
        .map(|i| (0..(i * 7 % 23 + 1)).map(|t| i * 100 + t).collect())
        .collect();
    assert_same_bytes("threads258", &rows, 1, &[1, 258]);
}

#[test]
fn absurd_thread_counts_are_refused_up_front() {
    for threads in [0, pool::MAX_THREADS + 1, 10_000] {
        match pool::install(Some(threads), || Ok(())) {
            Err(CoreError::Config(msg)) => assert!(
                msg.contains(&format!("between 1 and {}", pool::MAX_THREADS)),
                "{msg}"
            ),
            other => panic!("threads={threads} gave {other:?}"),
        }
    }
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
    assert!(matches!(err, CoreError::Data { .. }), "{msg}");
    assert!(
        msg.contains("b.parquet, row group 0, row 1, column \"input_ids\""),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recorded_ranges_tile_the_shard_and_checked_reads_catch_a_flipped_byte() {
    let dir = temp_dir("checked");
    let rows: Vec<Vec<i64>> = (0..30).map(|i| (1..(i * 5 % 17 + 2)).collect()).collect();
    write_input(&dir.join("a.parquet"), &rows);
    let cfg = config(&dir, vec![dir.join("a.parquet")], "out");
    let outcome = pack_files(&cfg, &Progress::new()).unwrap();
    for shard in &outcome.shards {
        let path = cfg.out_dir.join(&shard.file);
        // Magic, then one range per row group, then the footer, back to back to the end.
        let mut pos = 4;
        for r in shard.row_group_bytes.iter().chain([&shard.footer_bytes]) {
            assert_eq!(r.offset, pos);
            pos += r.length;
        }
        assert_eq!((pos, shard.checksum.clone()), file_checksum(&path).unwrap());
        assert_eq!(shard.size, pos);
        let check = |g: usize| GroupCheck {
            size: shard.size,
            footer: shard.footer_bytes.clone(),
            group: shard.row_group_bytes[g].clone(),
        };
        let mut total = 0;
        for g in 0..shard.row_groups as usize {
            total += read_checked_row_group(&path, g, &["input_ids"], &check(g))
                .unwrap()
                .num_rows();
        }
        assert_eq!(total as u64, shard.rows);
    }
    let shard = &outcome.shards[0];
    let path = cfg.out_dir.join(&shard.file);
    let mut bytes = std::fs::read(&path).unwrap();
    let group = &shard.row_group_bytes[1];
    bytes[(group.offset + group.length / 2) as usize] ^= 1;
    std::fs::write(&path, bytes).unwrap();
    let check = GroupCheck {
        size: shard.size,
        footer: shard.footer_bytes.clone(),
        group: group.clone(),
    };
    let err = read_checked_row_group(&path, 1, &["input_ids"], &check).unwrap_err();
    assert!(err.to_string().contains("row group 1: bytes"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
