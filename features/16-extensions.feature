Feature: Project extensions
  Parity logging, proof bundles, the bounded queue, hostile input, the anti-cheat
  haiku and the tokenize endpoints (REQUIREMENTS.md section 16).

  @EXT-001 @any
  Scenario: Parity logs are one record per token, reproducible, and a doctored log is flagged
    Given a worker on the reference model with flags "--parity-log {scratch}/a.jsonl"
    When I run the job:
      """
      {"job_id": "ext001-a", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
      """
    And I stop the worker
    Then "{scratch}/a.jsonl" has one parity record per token of job "ext001-a"
    Given a worker on the reference model with flags "--parity-log {scratch}/b.jsonl"
    When I run the job:
      """
      {"job_id": "ext001-b", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
      """
    And I stop the worker
    Then "harness parity {scratch}/a.jsonl {scratch}/b.jsonl" reports no divergence
    When I doctor step 3's logits in "{scratch}/b.jsonl" as "{scratch}/c.jsonl"
    Then "harness parity {scratch}/a.jsonl {scratch}/c.jsonl" reports the first divergence at step 3
    And on cuda the parity logs of the CPU and CUDA backends for this job diff clean

  @EXT-002 @any
  Scenario: The requirement matrix lists every ID exactly once with a result
    When I run the harness suite with "--tags @no-scenario-has-this-tag --proof-dir {scratch}/proof"
    Then the harness exited zero
    And its matrix.json lists every requirement ID of REQUIREMENTS.md exactly once with a result

  @EXT-003 @any
  Scenario: A queue of depth 2 takes three of four jobs in order and refuses one with 503
    Given a worker on the reference model with flags "--queue-depth 2"
    When I post these jobs at once:
      """
      [{"job_id": "ext003-1", "prompt": "Job one", "max_tokens": 6, "temperature": 0},
       {"job_id": "ext003-2", "prompt": "Job two", "max_tokens": 6, "temperature": 0},
       {"job_id": "ext003-3", "prompt": "Job three", "max_tokens": 6, "temperature": 0},
       {"job_id": "ext003-4", "prompt": "Job four", "max_tokens": 6, "temperature": 0}]
      """
    And all jobs end
    Then 3 jobs were accepted and 1 refused with 503 "QUEUE_FULL" and a Retry-After header
    And the refused job's error is retriable
    And the accepted jobs ran one at a time in the order they were accepted
    And every accepted job ended with exactly one terminal event

  @EXT-004 @any
  Scenario: Bad input never crashes the worker
    Given a worker on the reference model
    When I send these hostile requests to /execute:
      | case               | status |
      | malformed JSON     | 400    |
      | invalid UTF-8      | 400    |
      | wrong content type | 400    |
      | oversized body     | 413    |
      | JSON array         | 400    |
      | deep nesting       | 400    |
    Then each got its status with an "INVALID_REQUEST" body
    And /health says "healthy"
    When I stop the worker
    Then each of these hostile models makes the worker exit 1 cleanly with "MODEL_LOAD_FAILED":
      | model             |
      | absurd-kv-count   |
      | huge-string       |
      | tensor-past-eof   |
      | tensor-overlap    |
      | dim-overflow      |
      | unknown-type      |
      | misaligned-offset |
      | cut-mid-tensor    |
    And the worker's unit tests named "gguf::tests::fuzz_mutations_never_panic" pass

  @EXT-005 @cuda
  Scenario: The haiku's CUDA log-probabilities agree with the CPU reference
    Given a worker on the reference model
    When I ask for a haiku about the current minute with a fresh nonce, temperature 0.7, seed 42 and 50 tokens
    Then the haiku's top-5 log-probabilities over the first 8 steps agree with the CPU backend within 0.1 nats
    And the haiku, its prompt, nonce and whether the minute word appears are in the proof bundle

  @EXT-006 @any
  Scenario: /tokenize and /detokenize answer the goldens while a long job streams
    Given a worker on the reference model
    When I start the job:
      """
      {"job_id": "ext006", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    And job "ext006" has streamed 1 tokens
    Then every golden tokenizer vector encodes to its ids through /tokenize
    And every golden tokenizer vector decodes back to its text through /detokenize
    And job "ext006" was still streaming afterwards
    And /tokenize with an empty body is refused with 400 "INVALID_REQUEST"
