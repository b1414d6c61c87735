Feature: Test suite
  The haiku test, unit tests, the end-to-end run, UTF-8 streaming, repeatability,
  the performance suite and the proof bundle (REQUIREMENTS.md section 14).

  @M0-W-1800 @any
  Scenario: The anti-cheat haiku streams, reproduces and changes with its minute
    Given a worker on the reference model
    When I ask for a haiku about the current minute with a fresh nonce, temperature 0.7, seed 42 and 50 tokens
    Then the haiku streamed started, at least 1 token and end with no U+FFFD
    And the same haiku request with the same seed gives the same token ids
    And the haiku request for another minute gives other token ids
    And /health reports the residency of the launched backend
    And the haiku, its prompt, nonce and whether the minute word appears are in the proof bundle

  @M0-W-1810 @cuda
  Scenario: The CUDA backend's unit tests pass on a GPU with zero skips
    Then the worker's unit tests named "cuda" pass

  @M0-W-1811 @any
  Scenario: The host-side unit tests pass on a GPU-less host
    Then all of the worker's unit tests pass on this backend
    And the worker's unit tests named "server::tests::" pass

  @M0-W-1820 @any
  Scenario: End to end: start, execute, rerun identically, report the backend, exit 0
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1820-a", "messages": [{"role": "user", "content": "Write one sentence about the sea."}], "max_tokens": 12, "temperature": 0, "seed": 5}
      """
    Then job "w1820-a" has conformant SSE framing
    And every job streamed a conformant transcript
    When I run the job:
      """
      {"job_id": "w1820-b", "messages": [{"role": "user", "content": "Write one sentence about the sea."}], "max_tokens": 12, "temperature": 0, "seed": 5}
      """
    Then jobs "w1820-a" and "w1820-b" produced the same token ids
    And /health field "backend" is the launched backend
    And /health reports the residency of the launched backend
    When I shut the worker down by /shutdown
    Then the worker exits with code 0 within 30 s

  @M0-W-1821 @any
  Scenario: gpt-oss vocabulary goldens encode and decode exactly, also through hf-json
    Given a worker on the "synthetic-gpt-oss" model
    Then every golden tokenizer vector of "testdata/golden-synth/gpt-oss-tokenize.json" encodes to its ids through /tokenize
    And every golden tokenizer vector of "testdata/golden-synth/gpt-oss-tokenize.json" decodes back to its text through /detokenize
    When I stop the worker
    And the worker is started on the "synthetic-gpt-oss-tokenizer-json" model with flags "--tokenizer hf-json"
    Then the start serves with tokenizer "hf-json"
    And every golden tokenizer vector of "testdata/golden-synth/gpt-oss-tokenize.json" encodes to its ids through /tokenize, or to tiktoken's where llama.cpp's pre-tokenizer splits otherwise
    And every golden tokenizer vector of "testdata/golden-synth/gpt-oss-tokenize.json" decodes back to its text through /detokenize

  @M0-W-1822 @cuda
  Scenario: Every weight format's micro-goldens match the f32 CPU within 1%
    Then the worker's unit tests named "matches_cpu_for_every_format" pass

  @M0-W-1823 @cuda
  Scenario: A GPT-OSS-20B-shaped synthetic model loads on one GPU and streams
    Given a worker on the "synthetic-gpt-oss-20b" model
    Then /health field "quant_kind" is "MXFP4"
    And /health field "resident" is true
    And /health field "vram_bytes_used" is within 20% of the model's tensor bytes
    When I run the job:
      """
      {"job_id": "w1823", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
      """
    Then job "w1823" streamed started, at least 1 token and end

  @M0-W-1824 @any
  Scenario Outline: Multibyte text streams as whole UTF-8 (<script>)
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1824", "prompt": "<prompt>", "max_tokens": 16, "temperature": 0.7, "seed": 3}
      """
    Then every token text of job "w1824" is whole UTF-8, with U+FFFD only for a character cut off by max_tokens
    And job "w1824"'s joined text equals /detokenize of its token ids
    And the worker's unit tests named "tokenizer::tests::stream_decoder_holds_back_split_emoji" pass

    Examples:
      | script  | prompt                                 |
      | Chinese | 请用中文写一首关于大海的短诗。            |
      | emoji   | Reply with emoji only: 🌊🐳🌞🎉 and more |
      | mixed   | Mix: Привет, 你好, مرحبا, 👋 — continue |

  @M0-W-1825 @cuda
  Scenario: A job needing more VRAM than is free gets VRAM_OOM and the next job succeeds
    Given the worker environment "WORKER_ORCD_VRAM_CAP_BYTES" is "120000000"
    And a worker on the reference model
    When I run the job:
      """
      {"job_id": "w1825-big", "prompt": "Count upward: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "max_tokens": 2048, "temperature": 0}
      """
    Then job "w1825-big" ended with error "VRAM_OOM"
    And job "w1825-big"'s error is not retriable
    When I run the job:
      """
      {"job_id": "w1825-small", "prompt": "Hello", "max_tokens": 10, "temperature": 0}
      """
    Then job "w1825-small" streamed started, at least 1 token and end

  @M0-W-1826 @any
  Scenario: Two greedy runs of the haiku prompt give identical ids
    Given a worker on the reference model
    When I run this job 2 times:
      """
      {"job_id": "w1826", "messages": [{"role": "user", "content": "Write a haiku about GPU computing"}], "max_tokens": 50, "temperature": 0, "seed": 42}
      """
    Then all 2 runs produced the same token ids

  @M0-W-1830 @bench
  Scenario: The performance suite fails on a missed budget and reports into the proof bundle
    Given a budgets file "impossible.yaml" where every ceiling is 0.000001 and every floor is 1000000000
    When I run the harness suite with "--tags @M0-W-1604 --budgets {scratch}/impossible.yaml --proof-dir {scratch}/proof"
    Then the harness exited non-zero
    And its proof bundle's timings.json has a missed "health_ms_p99" verdict with p50, p95 and p99

  @M0-W-1840 @any
  Scenario: Each run writes its proof bundle where LLORCH_PROOF_DIR says
    When I run the harness suite with "--tags @no-scenario-has-this-tag" and LLORCH_PROOF_DIR "{scratch}/moved" and LLORCH_RUN_ID "proof-check"
    Then the harness exited zero
    And "{scratch}/moved/conformance/proof-check" holds "seeds.ndjson", "metadata.json", "transcript.ndjson", "timings.json", "README.md", "junit.xml", "matrix.md" and "matrix.json"
