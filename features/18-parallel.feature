Feature: Many clients at once
  With --parallel N the engine runs up to N jobs together, each in a slot of its own,
  decoding them in one step; a job's tokens are the same beside others as alone (issue 18).

  @EXT-018.1 @any
  Scenario: Four jobs posted at once to a worker with four slots stream together and each ends once
    Given a worker on the reference model with flags "--parallel 4"
    Then /health field "slots_total" is 4
    When I post these jobs at once:
      """
      [{"job_id": "p18-1", "prompt": "Tell me about the sea.", "max_tokens": 24, "temperature": 0},
       {"job_id": "p18-2", "prompt": "The history of Rome begins", "max_tokens": 24, "temperature": 0.8, "seed": 3},
       {"job_id": "p18-3", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 24, "temperature": 0},
       {"job_id": "p18-4", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.5, "seed": 9}]
      """
    And all jobs end
    Then jobs "p18-1", "p18-2", "p18-3" and "p18-4" ended with "end"
    And every accepted job ended with exactly one terminal event
    And at least 4 of the jobs streamed at the same time
    And /health field "slots_free" is 4
    And /health field "slots_busy" is 0
    When I scrape /metrics
    Then the scrape's "worker_slots" is 4
    And the scrape's "worker_running_jobs" is 0
    And the scrape has "worker_batch_rows_count", "worker_kv_cache_bytes"

  @EXT-018.2 @any
  Scenario: Sixteen seeded jobs give the same tokens posted at once as each gives alone
    Given a worker on the reference model with flags "--parallel 16 --queue-depth 16"
    When I run each of these jobs alone, then all of them at once:
      """
      [{"job_id": "b18-01", "prompt": "Hi", "max_tokens": 12, "temperature": 0},
       {"job_id": "b18-02", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 3},
       {"job_id": "b18-03", "prompt": "Write a haiku about autumn leaves falling in the quiet park.", "max_tokens": 12, "temperature": 0.8, "seed": 1},
       {"job_id": "b18-04", "prompt": "1, 2, 3, 4,", "max_tokens": 12, "temperature": 0.7, "top_k": 40, "seed": 2, "logprobs": 2},
       {"job_id": "b18-05", "messages": [{"role": "user", "content": "What is the boiling point of water?"}], "max_tokens": 12, "temperature": 0},
       {"job_id": "b18-06", "messages": [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Describe your ship, its crew, and the treasure you are looking for."}], "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 3},
       {"job_id": "b18-07", "prompt": "A", "max_tokens": 12, "temperature": 1.2, "seed": 4},
       {"job_id": "b18-08", "prompt": "In the beginning the universe was created. This has made a lot of people very angry and been widely regarded as a bad move. Many were increasingly of the opinion that", "max_tokens": 12, "temperature": 0, "repetition_penalty": 1.2},
       {"job_id": "b18-09", "prompt": "def fibonacci(n):", "max_tokens": 12, "temperature": 0.6, "min_p": 0.05, "seed": 5},
       {"job_id": "b18-10", "prompt": "Translate to French: good morning", "max_tokens": 12, "temperature": 0, "logprobs": 5},
       {"job_id": "b18-11", "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 12, "temperature": 0.9, "seed": 6, "repetition_penalty": 1.1},
       {"job_id": "b18-12", "prompt": "Roses are red, violets are blue,", "max_tokens": 12, "temperature": 0.8, "top_k": 10, "top_p": 0.8, "seed": 7},
       {"job_id": "b18-13", "prompt": "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox", "max_tokens": 12, "temperature": 0},
       {"job_id": "b18-14", "prompt": "Q: Why is the sky blue?\nA:", "max_tokens": 12, "temperature": 0.5, "seed": 8, "logprobs": 1},
       {"job_id": "b18-15", "messages": [{"role": "user", "content": "List three fruits."}], "max_tokens": 12, "temperature": 0.3, "seed": 9},
       {"job_id": "b18-16", "prompt": "Dear diary,", "max_tokens": 12, "temperature": 1.0, "seed": 10}]
      """
    Then each job gave the same tokens at once as alone
    And at least 8 of the jobs streamed at the same time

  # Pages of the paged KV pool are the driver's 2 MiB: a 4 MiB budget is two
  # blocks. Each job needs under 1 MB (SmolLM2: 23,040 bytes a position), so
  # bytes alone would let all four run; blocks let two.
  @EXT-018.3 @cuda
  Scenario: Jobs take their KV caches from a pool of blocks fixed at start-up, wait for free blocks rather than fail, and give every block back
    Given a worker on the reference model with flags "--parallel 4 --kv-cache-size-mb 4"
    When I scrape /metrics
    Then the scrape's "worker_kv_blocks_total" is above 0
    And the scrape's "worker_kv_blocks_used" is 0
    And the scrape's "worker_kv_blocks_free" equals its "worker_kv_blocks_total"
    When I post these jobs at once:
      """
      [{"job_id": "k18-1", "prompt": "Tell me about the sea.", "max_tokens": 30, "temperature": 0},
       {"job_id": "k18-2", "prompt": "The history of Rome begins", "max_tokens": 30, "temperature": 0},
       {"job_id": "k18-3", "prompt": "Once upon a time", "max_tokens": 30, "temperature": 0.7, "seed": 4},
       {"job_id": "k18-4", "prompt": "Count to ten:", "max_tokens": 30, "temperature": 0}]
      """
    And all jobs end
    Then jobs "k18-1", "k18-2", "k18-3" and "k18-4" ended with "end"
    And every accepted job ended with exactly one terminal event
    And at least 2 of the jobs streamed at the same time
    And at most 2 of the jobs streamed at the same time
    When I scrape /metrics
    Then the scrape's "worker_kv_blocks_used" is 0
    And the scrape's "worker_kv_blocks_free" equals its "worker_kv_blocks_total"
    And the scrape's "worker_kv_cache_bytes" is 0
    And the scrape's "worker_running_jobs" is 0
