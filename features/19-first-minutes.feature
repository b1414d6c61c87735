Feature: The first five minutes
  A person starts the worker with `serve` and a relative path, reads one short
  line per event on a terminal, gets start-up errors that say what to do, and
  finds a README whose quick start works as written (issue 48).

  @EXT-048.1 @any
  Scenario: `serve` takes a relative path, llama-server's short flags and defaults for the rest
    When the worker is started by hand with "serve {model_file} --backend {backend} -p {port} -c 512 -np 2"
    Then the worker becomes healthy within 120 s
    And /health field "slots_total" is 2
    And /health field "context_length" is 512
    And the "startup" record carries a generated worker id that /health reports
    When I run the job:
      """
      {"job_id": "by-hand", "prompt": "Say hello.", "max_tokens": 4, "temperature": 0}
      """
    Then job "by-hand" streamed started, at least 1 token and end

  @EXT-048.2 @any
  Scenario: Each start-up mistake gets one line that says what to do
    When the worker is started by hand with ""
    Then the worker exits with code 2 within 30 s
    And the worker's output says "--worker-id, --model, --gpu-device and --port are required" once
    And the worker's output mentions "worker-orcd serve MODEL.gguf"
    When the worker is started by hand with "serve {fixture:cut-mid-tensor} --backend cpu -p {port}"
    Then the worker exits with code 1 within 30 s
    And the worker's output says "the file is truncated" once
    And the worker's output mentions "the file has", "download it again"
    Given the worker environment "CUDA_VISIBLE_DEVICES" is ""
    When the worker is started by hand with "serve {model_file} -p {port}"
    Then the worker exits with code 1 within 60 s
    And the worker's output says "use --backend cpu" once
    When the worker is started by hand with "generate --model {model_file} --prompt Hello --max-tokens 1"
    Then the worker exits with code 1 within 60 s
    And the worker's output says "use --backend cpu" once

  @EXT-048.3 @any
  Scenario: On a terminal, one short line per event, constant fields once, rounded floats, refusals with their reason
    Given a worker on the reference model with flags "--log-format pretty"
    When I run the job:
      """
      {"job_id": "text-log", "prompt": "Say hello.", "max_tokens": 4, "temperature": 0.7, "seed": 1}
      """
    Then job "text-log" streamed started, at least 1 token and end
    When I post to /execute:
      """
      {"job_id": "refused", "prompt": "A-PROMPT-MARKER-48", "max_tokens": 5000}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "max_tokens"
    When I stop the worker
    Then the worker's output is text, every line at most 400 characters and half at most 160
    And only the worker's "startup" line carries its worker id and model path
    And the worker's output mentions "execute_start", "temperature=0.7 "
    And the worker's output mentions "execute_rejected", "field=max_tokens", "must be between 1 and 2048"
    And the worker's log does not contain "A-PROMPT-MARKER-48"

  @EXT-048.4 @any
  Scenario: The README's quick start streams a reply and stops on Ctrl-C; its examples and docs/API.md's run as written
    When I start the README's quick-start command in a terminal of its own
    Then the worker becomes healthy within 900 s
    And every "example" command of "README.md" succeeds against the worker
    And GET / names the worker, its version, the model and every route of /openapi.json
    When I press Ctrl-C in its terminal
    Then the worker exits with code 0 within 30 s
    Given a worker on the reference model
    Then every "example" command of "docs/API.md" succeeds against the worker
    And the worker exits with code 0 within 30 s
