Feature: Prompt reuse
  The prefix cache (issue 42): prompts' whole chunks kept after their jobs, and each prompt's last
  chunk with its last logits, so that a prompt that starts with the same tokens computes only the
  rest (the same prompt again: nothing), with the same tokens and log-probabilities as when
  everything is computed; what was cached reported in the end event, /metrics and /health.

  @EXT-042.1 @any
  Scenario: a prefix from the cache, whole or in part, gives the tokens of a computed one, 16 jobs at once
    Given a worker on the reference model with flags "--parallel 16 --queue-depth 16"
    And a reference worker on the reference model with flags "--parallel 16 --queue-depth 16 --prefix-cache off"
    When the reference worker runs 16 jobs sharing a 1200-token prefix as "computed", one after another
    And the worker runs them as "shared": the first alone, then the rest at once
    And the worker runs them as "again", all at once
    Then jobs "computed" report tokens_cached 0
    And job "shared" reports tokens_cached 0 and the others their prefix's whole chunks shared with it
    And jobs "again" report their whole prompts cached
    And jobs "shared" streamed the same tokens and log-probabilities as jobs "computed"
    And jobs "again" streamed the same tokens and log-probabilities as jobs "computed"
    And /metrics counts the cached and the computed prompt tokens of jobs "shared, again"

  @EXT-042.3 @any
  Scenario: prompts posted together with a common start compute it once, and give the tokens of computed ones
    Given a worker on the reference model with flags "--parallel 16 --queue-depth 16"
    And a reference worker on the reference model with flags "--parallel 16 --queue-depth 16 --prefix-cache off"
    When the reference worker runs 16 jobs sharing a 1200-token prefix as "computed", one after another
    And the worker runs them as "burst", all at once
    Then one job "burst" computed the shared prefix and every other attached its whole chunks
    And jobs "burst" streamed the same tokens and log-probabilities as jobs "computed"

  @EXT-042.2 @any
  Scenario: the switch, and what the OpenAI usage and /health report
    Given a worker on the reference model
    And a reference worker on the reference model with flags "--prefix-cache off"
    Then a chat with a 1200-token system prompt sent twice reports no cached tokens, then all of them, and another question after it whole chunks
    And on the reference worker the same chat sent twice reports no cached tokens and /health no prefix cache
