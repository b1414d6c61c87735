//! `POST /cancel`.

use cucumber::{then, when};

use crate::check;
use crate::steps::params::Times;
use crate::steps::StepResult;
use crate::world::TestWorld;

#[when(expr = "I cancel job {string}{times}")]
async fn cancel(w: &mut TestWorld, id: String, times: Times) -> StepResult {
    let client = w.client()?;
    for _ in 0..times.0 {
        let r = client.cancel(&id).await?;
        w.stream.cancel_replies.push(r);
    }
    Ok(())
}

#[then(expr = "every cancel reply was 202")]
async fn all_202(w: &mut TestWorld) -> StepResult {
    check!(!w.stream.cancel_replies.is_empty(), "no cancel was sent");
    let bad: Vec<String> = w
        .stream
        .cancel_replies
        .iter()
        .filter(|r| r.status != 202)
        .map(|r| format!("{} {}", r.status, r.body))
        .collect();
    check!(bad.is_empty(), "cancel replies that were not 202: {bad:?}");
    Ok(())
}
