use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn seqs_of<'a>(tokens: &'a [Vec<i64>], trained: &'a [Vec<bool>]) -> Vec<Seq<'a>> {
    tokens
        .iter()
        .zip(trained)
        .map(|(t, m)| Seq::new(t, Trained::Flags(m)))
        .collect()
}

fn all(n: usize) -> Vec<Vec<u32>> {
    vec![(0..n as u32).collect()]
}

/// Checks every layout invariant of `rows` for `seqs`; returns the rows' tokens.
fn check(seqs: &[Seq<'_>], f: &Forest, pieces: &[Piece], rows: &[Vec<u32>], cap: u64) -> u64 {
    let t = layout(seqs, f, pieces, rows);
    assert_eq!(t.seq_index, (0..seqs.len() as i64).collect::<Vec<_>>());
    for r in 0..rows.len() {
        let (a, b) = (t.row_offsets[r] as usize, t.row_offsets[r + 1] as usize);
        let (na, nb) = (t.node_offsets[r] as usize, t.node_offsets[r + 1] as usize);
        assert!((b - a) as u64 <= cap);
        for u in na..nb {
            let (tin, tout) = (t.node_tin[u], t.node_tout[u]);
            assert!(tin < tout && tout as usize <= b - a);
            let p = t.node_parent[u];
            if p >= 0 {
                let p = na + p as usize;
                // Intervals nest; positions continue from the parent's end.
                assert!(t.node_tin[p] < tin && tout <= t.node_tout[p]);
                assert_eq!(t.node_depth[u], t.node_depth[p] + t.node_len[p]);
            } else {
                assert_eq!(t.node_depth[u], 0);
            }
            for k in tin..tin + t.node_len[u] {
                let k = a + k as usize;
                assert_eq!(t.token_node[k], (u - na) as i64);
                assert_eq!(t.token_tout[k], tout);
                assert_eq!(
                    t.position_ids[k],
                    t.node_depth[u] + k as i64 - a as i64 - tin
                );
            }
        }
    }
    let mut weight = vec![0i64; t.pred_pos.len()];
    for (i, s) in seqs.iter().enumerate() {
        let r = t.seq_row[i] as usize;
        let (a, na) = (t.row_offsets[r] as usize, t.node_offsets[r] as usize);
        let mut path = Vec::new();
        let mut u = t.seq_end_node[i];
        while u >= 0 {
            path.push(na + u as usize);
            u = t.node_parent[na + u as usize];
        }
        path.reverse();
        // The path is exactly the sequence's tokens, at positions 0..len.
        let packed: Vec<usize> = path
            .iter()
            .flat_map(|&u| (t.node_tin[u]..t.node_tin[u] + t.node_len[u]).map(|k| k as usize))
            .collect();
        let tokens: Vec<i64> = packed.iter().map(|&k| t.input_ids[a + k]).collect();
        assert_eq!(tokens, (0..s.len()).map(|j| s.token(j)).collect::<Vec<_>>());
        let positions: Vec<i64> = packed.iter().map(|&k| t.position_ids[a + k]).collect();
        assert_eq!(positions, (0..s.len() as i64).collect::<Vec<_>>());
        // Each key on the path is visible from the path's later tokens, by the interval rule.
        for (x, &q) in packed.iter().enumerate() {
            for &k in &packed[..=x] {
                assert!(k <= q && (q as i64) < t.token_tout[a + k]);
            }
        }
        let preds = &t.target_pred[t.target_offsets[i] as usize..t.target_offsets[i + 1] as usize];
        let trained: Vec<usize> = (1..s.len()).filter(|&j| s.trained(j)).collect();
        assert_eq!(preds.len(), trained.len());
        for (&p, &j) in preds.iter().zip(&trained) {
            let p = p as usize;
            assert_eq!(t.pred_row[p] as usize, r);
            assert_eq!(t.pred_pos[p] as usize, packed[j - 1]);
            assert_eq!(t.pred_token[p], s.token(j));
            weight[p] += 1;
        }
    }
    assert_eq!(weight, t.pred_weight);
    let keys: BTreeSet<_> = (0..t.pred_pos.len())
        .map(|p| (t.pred_row[p], t.pred_pos[p], t.pred_token[p]))
        .collect();
    assert_eq!(keys.len(), t.pred_pos.len(), "each prediction once");
    t.input_ids.len() as u64
}

/// Checks `t` as a batch aligned to `multiple`: each row's tokens, then the padding.
fn check_batch(t: &TreeRows, multiple: usize) {
    let b = t.clone().into_batch(multiple, 9);
    let rows = t.row_offsets.len() - 1;
    let longest = (0..rows)
        .map(|r| (t.row_offsets[r + 1] - t.row_offsets[r]) as usize)
        .max()
        .unwrap_or(0);
    assert_eq!((b.rows, b.width % multiple), (rows, 0));
    assert!(b.width >= longest && b.width < longest + multiple);
    for r in 0..rows {
        let (lo, hi) = (t.row_offsets[r] as usize, t.row_offsets[r + 1] as usize);
        let at = |v: &[i64], c: usize| v[r * b.width + c];
        for c in 0..b.width {
            let got = [
                at(&b.input_ids, c),
                at(&b.position_ids, c),
                at(&b.token_node, c),
                at(&b.token_tout, c),
            ];
            let want = if lo + c < hi {
                let k = lo + c;
                [
                    t.input_ids[k],
                    t.position_ids[k],
                    t.token_node[k],
                    t.token_tout[k],
                ]
            } else {
                [9, 0, -1, c as i64 + 1]
            };
            assert_eq!(got, want);
        }
    }
    let lengths: Vec<i64> = t.target_offsets.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(b.completion_lengths, lengths);
    assert_eq!(
        (b.forward_tokens, &b.pred_row),
        (t.input_ids.len() as i64, &t.pred_row)
    );
}

#[test]
fn a_group_shares_its_prompt() {
    let prompt: Vec<i64> = (0..10).collect();
    let completions = [vec![20, 21, 22], vec![30, 31], vec![20, 25]];
    let tokens: Vec<Vec<i64>> = completions
        .iter()
        .map(|c| prompt.iter().chain(c).copied().collect())
        .collect();
    let trained: Vec<Vec<bool>> = tokens
        .iter()
        .map(|t| (0..t.len()).map(|j| j >= 10).collect())
        .collect();
    let seqs = seqs_of(&tokens, &trained);
    let f = build(&seqs, &all(3), 1).unwrap();
    // prompt; [20]; [21 22]; [25]; [30 31]
    assert_eq!(f.len(), 5);
    assert_eq!(f.unique_tokens(), 10 + 1 + 2 + 1 + 2);
    let p = pieces(&f, 64).unwrap();
    let rows = pack_rows(&p.iter().map(|p| p.tokens).collect::<Vec<_>>(), 64);
    assert_eq!(check(&seqs, &f, &p, &rows, 64), 16);
    // Below the minimum shared length, the shared "20" is copied into both branches.
    let f = build(&seqs, &all(3), 2).unwrap();
    assert_eq!(f.unique_tokens(), 10 + 3 + 2 + 2);
}

#[test]
fn a_tree_larger_than_a_row_is_cut_with_its_prefix() {
    let prompt: Vec<i64> = (0..8).collect();
    let tokens: Vec<Vec<i64>> = (0..4)
        .map(|g| prompt.iter().copied().chain([100 + g; 5]).collect())
        .collect();
    let trained: Vec<Vec<bool>> = tokens.iter().map(|t| vec![true; t.len()]).collect();
    let seqs = seqs_of(&tokens, &trained);
    let f = build(&seqs, &all(4), 1).unwrap();
    let p = pieces(&f, 20).unwrap();
    assert_eq!(p.len(), 2);
    assert!(p.iter().all(|p| p.tokens == 18 && p.chain.len() == 1));
    let rows = pack_rows(&p.iter().map(|p| p.tokens).collect::<Vec<_>>(), 20);
    assert_eq!(check(&seqs, &f, &p, &rows, 20), 36);
}

#[test]
fn nested_turns_and_duplicates_end_inside_one_path() {
    let tokens = vec![
        vec![1, 2],
        vec![1, 2, 3, 4],
        vec![1, 2, 3, 4, 5, 6],
        vec![1, 2, 3, 4],
    ];
    let trained: Vec<Vec<bool>> = tokens.iter().map(|t| vec![true; t.len()]).collect();
    let seqs = seqs_of(&tokens, &trained);
    let f = build(&seqs, &all(4), 1).unwrap();
    assert_eq!(f.unique_tokens(), 6);
    let p = pieces(&f, 6).unwrap();
    let rows = pack_rows(&p.iter().map(|p| p.tokens).collect::<Vec<_>>(), 6);
    assert_eq!(rows.len(), 1);
    check(&seqs, &f, &p, &rows, 6);
}

#[test]
fn the_same_inputs_give_the_same_forest_on_any_pool() {
    let tokens: Vec<Vec<i64>> = (0..200).map(|i| vec![i % 3, i % 5, i % 7, i]).collect();
    let trained: Vec<Vec<bool>> = tokens.iter().map(|t| vec![true; t.len()]).collect();
    let seqs = seqs_of(&tokens, &trained);
    let groups: Vec<Vec<u32>> = (0..4).map(|g| (g * 50..(g + 1) * 50).collect()).collect();
    let one = crate::pool::install(Some(1), || build(&seqs, &groups, 1)).unwrap();
    let two = crate::pool::install(Some(2), || build(&seqs, &groups, 1)).unwrap();
    assert_eq!(one, two);
}

#[test]
fn every_sequence_needs_one_group_and_a_token() {
    let tokens = vec![vec![1, 2], vec![]];
    let trained = vec![vec![true; 2], vec![]];
    let seqs = seqs_of(&tokens, &trained);
    let e = build(&seqs, &all(2), 1).unwrap_err().to_string();
    assert!(e.contains("sequence 1 is empty"), "{e}");
    let e = build(&seqs[..1], &[vec![0], vec![0]], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("once"), "{e}");
}

#[test]
fn heads_shared_by_reference_compare_like_copies() {
    let prompt: Vec<i64> = vec![5, 6, 7];
    let tails = [vec![1, 2], vec![1, 3], vec![0]];
    let copies: Vec<Vec<i64>> = tails
        .iter()
        .map(|t| [prompt.clone(), t.clone()].concat())
        .collect();
    let by_ref: Vec<Seq<'_>> = tails
        .iter()
        .map(|t| Seq {
            head: &prompt,
            tail: t,
            head_trained: Trained::None,
            tail_trained: Trained::All,
        })
        .collect();
    let flags: Vec<Vec<bool>> = copies
        .iter()
        .map(|c| (0..c.len()).map(|j| j >= 3).collect())
        .collect();
    let copied = seqs_of(&copies, &flags);
    let (a, b) = (
        build(&by_ref, &all(3), 1).unwrap(),
        build(&copied, &all(3), 1).unwrap(),
    );
    assert_eq!(
        (a.start.clone(), a.end.clone(), a.parent.clone()),
        (b.start, b.end, b.parent)
    );
    let p = pieces(&a, 16).unwrap();
    check(&by_ref, &a, &p, &[vec![0]], 16);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, rng_seed: proptest::test_runner::RngSeed::Fixed(37), ..ProptestConfig::default() })]

    #[test]
    fn layout_invariants_hold(
        raw in prop::collection::vec((prop::collection::vec(0i64..3, 1..9), any::<u16>()), 1..24),
        min_shared in 1usize..4,
        extra in 0u64..12,
        groups in 1usize..3,
    ) {
        let tokens: Vec<Vec<i64>> = raw.iter().map(|(t, _)| t.clone()).collect();
        let trained: Vec<Vec<bool>> = raw.iter().map(|(t, m)| (0..t.len()).map(|j| (m >> (j % 16)) & 1 == 1).collect()).collect();
        let seqs = seqs_of(&tokens, &trained);
        let n = seqs.len() as u32;
        let g: Vec<Vec<u32>> = (0..groups as u32).map(|k| (0..n).filter(|i| i % groups as u32 == k).collect()).filter(|g: &Vec<u32>| !g.is_empty()).collect();
        let f = build(&seqs, &g, min_shared).unwrap();
        if min_shared == 1 {
            // With no minimum, the trees hold each distinct prefix of a group once.
            let t = &tokens;
            let distinct: usize = g.iter().map(|g| {
                g.iter().flat_map(|&i| (1..=t[i as usize].len()).map(move |k| t[i as usize][..k].to_vec())).collect::<BTreeSet<_>>().len()
            }).sum();
            prop_assert_eq!(f.unique_tokens() as usize, distinct);
        }
        let cap = 8 + extra;
        let p = pieces(&f, cap).unwrap();
        let rows = pack_rows(&p.iter().map(|p| p.tokens).collect::<Vec<_>>(), cap);
        let forward = check(&seqs, &f, &p, &rows, cap);
        // A row laid out on its own is that row of the rows laid out together, alone.
        for (alone, row) in layout_each(&seqs, &f, &p, &rows).iter().zip(&rows) {
            prop_assert_eq!(alone, &layout(&seqs, &f, &p, std::slice::from_ref(row)));
            check_batch(alone, 1 + extra as usize % 3);
        }
        check_batch(&layout(&seqs, &f, &p, &rows), 1 + min_shared % 3);
        prop_assert!(forward >= f.unique_tokens());
        prop_assert!(forward <= tokens.iter().map(|t| t.len() as u64).sum::<u64>());
    }
}
