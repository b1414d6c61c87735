//! `logit_bias` and the presence and frequency penalties (issue 43), seen
//! from the token ids a job streams.

use std::collections::HashSet;

use anyhow::anyhow;
use cucumber::{then, when};
use serde_json::json;

use crate::check;
use crate::steps::StepResult;
use crate::world::TestWorld;

/// How many of a job's tokens repeat an earlier one of the same job.
async fn repeats(w: &mut TestWorld, id: &str) -> anyhow::Result<(usize, Vec<i64>)> {
    let ids = w.settle(id).await?.token_ids();
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    Ok((ids.len() - distinct.len(), ids))
}

#[then(expr = "job {string} repeats fewer tokens than job {string}")]
async fn fewer_repeats(w: &mut TestWorld, less: String, more: String) -> StepResult {
    let (few, few_ids) = repeats(w, &less).await?;
    let (many, many_ids) = repeats(w, &more).await?;
    check!(
        few < many,
        "job {less} repeats {few} tokens ({few_ids:?}), job {more} {many} ({many_ids:?})"
    );
    Ok(())
}

#[then(expr = "every token of job {string} is token {int}")]
async fn every_token_is(w: &mut TestWorld, id: String, want: i64) -> StepResult {
    let ids = w.settle(&id).await?.token_ids();
    check!(!ids.is_empty(), "job {id} streamed no token");
    check!(ids.iter().all(|&t| t == want), "job {id} streamed {ids:?}");
    Ok(())
}

/// Reruns a job with its first token's id banned by `logit_bias` -100.
#[when(expr = "I rerun job {string} as {string} with its first token banned")]
async fn rerun_banned(w: &mut TestWorld, from: String, to: String) -> StepResult {
    let first = *w
        .settle(&from)
        .await?
        .token_ids()
        .first()
        .ok_or_else(|| anyhow!("job {from} streamed no token"))?;
    let mut b = w.stream.request(&from)?.clone();
    b["job_id"] = json!(to);
    b["logit_bias"] = json!({ first.to_string(): -100 });
    w.run_job(b).await?;
    Ok(())
}

#[then(expr = "job {string} never streamed job {string}'s first token")]
async fn never_streamed(w: &mut TestWorld, id: String, from: String) -> StepResult {
    let first = w.settle(&from).await?.token_ids().first().copied();
    let ids = w.settle(&id).await?.token_ids();
    check!(!ids.is_empty(), "job {id} streamed no token");
    check!(
        first.is_some_and(|f| !ids.contains(&f)),
        "job {id} streamed {ids:?}, with {from}'s first token {first:?}"
    );
    Ok(())
}
