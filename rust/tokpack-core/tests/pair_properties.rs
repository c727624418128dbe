//! Preference pairs under the overlong policy (proptest): a kept or truncated pair fits its row,
//! keeps its whole prompt and at least one token of each completion, is cut only as much as
//! needed (no larger common cap fits), and is written as its layout's segments in role order.

use proptest::prelude::*;
use tokpack_core::io::pairs::{
    fate, Fate, PairLayout, PairLengths, Pairs, ROLE_CHOSEN, ROLE_PROMPT, ROLE_REJECTED,
};
use tokpack_core::policy::Overlong;

fn layouts() -> impl Strategy<Value = PairLayout> {
    prop_oneof![Just(PairLayout::Separate), Just(PairLayout::SharedPrompt)]
}

fn policies() -> impl Strategy<Value = Overlong> {
    prop_oneof![
        Just(Overlong::Truncate),
        Just(Overlong::Drop),
        Just(Overlong::Error)
    ]
}

proptest! {
    #[test]
    fn pairs_fit_whole_or_cut_at_the_water_level(
        prompt in 0i32..60, c in 1i32..200, r in 1i32..200, max_len in 1u32..400,
        layout in layouts(), overlong in policies(),
    ) {
        let input = PairLengths { chosen: prompt + c, rejected: prompt + r, prompt };
        let fits = input.footprint(layout) <= i64::from(max_len);
        let kept = match fate(input, layout, max_len, overlong) {
            Fate::Kept(k) => {
                prop_assert!(fits);
                prop_assert_eq!(k, input);
                k
            }
            Fate::Truncated(k) => {
                prop_assert!(!fits && overlong == Overlong::Truncate);
                prop_assert_eq!(k.prompt, prompt);
                let (kc, kr) = (k.chosen - prompt, k.rejected - prompt);
                prop_assert!((1..=c).contains(&kc) && (1..=r).contains(&kr));
                prop_assert!(k.footprint(layout) <= i64::from(max_len));
                // Cut at a common cap: the shorter side whole or both equal; one more token
                // of cap would not fit.
                let cap = kc.max(kr);
                prop_assert_eq!((kc, kr), (c.min(cap), r.min(cap)));
                let bigger = PairLengths {
                    chosen: prompt + c.min(cap + 1),
                    rejected: prompt + r.min(cap + 1),
                    prompt,
                };
                prop_assert!(bigger.footprint(layout) > i64::from(max_len));
                k
            }
            Fate::Dropped => {
                prop_assert!(!fits && overlong != Overlong::Error);
                return Ok(());
            }
            Fate::Overlong => {
                prop_assert!(!fits && overlong == Overlong::Error);
                return Ok(());
            }
            Fate::Empty => unreachable!("both completions are non-empty"),
        };
        let pairs = Pairs { layout, kept: vec![kept] };
        let mut parts = Vec::new();
        pairs.parts(0, &mut parts);
        let roles: Vec<i8> = parts.iter().map(|p| p.role).collect();
        let total: i64 = parts.iter().map(|p| p.len).sum();
        prop_assert_eq!(total, kept.footprint(layout));
        prop_assert!(parts.iter().all(|p| p.len >= 1 || p.role == ROLE_PROMPT));
        match layout {
            PairLayout::Separate => prop_assert_eq!(roles, vec![ROLE_CHOSEN, ROLE_REJECTED]),
            PairLayout::SharedPrompt => {
                prop_assert_eq!(roles, vec![ROLE_PROMPT, ROLE_CHOSEN, ROLE_REJECTED]);
                // The completions are read after the prompt of their own sequence.
                prop_assert_eq!((parts[1].start, parts[2].start), (i64::from(prompt), i64::from(prompt)));
            }
        }
    }
}
