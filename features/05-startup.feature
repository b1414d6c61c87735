Feature: Start-up and command line
  Flags are checked before the model loads; nothing listens before the load is
  done; a failed start leaves one ERROR record and a non-zero exit
  (REQUIREMENTS.md section 5).

  @M0-W-1100 @any
  Scenario Outline: A bad required flag exits 1 naming the flag (<case>)
    When the worker is started on the reference model with flags "<flags>"
    Then the worker exits with code 1 within 30 s
    And the worker's output names the flag "<flag>"
    And the worker never listened

    Examples:
      | case          | flags                                   | flag       |
      | bad UUID      | --worker-id not-a-uuid                  | worker-id  |
      | missing file  | --model /nonexistent/dir/model.gguf     | model      |
      | relative path | --model .models/smollm2-135m-instruct-q4_1.gguf | model |
      | port 80       | --port 80                               | port       |
      | busy port     | --port {busy_port}                      | port       |

    @cuda
    Examples:
      | case            | flags                     | flag       |
      | device id count | --gpu-device {gpu_count}  | gpu-device |

  @M0-W-1101 @any
  Scenario: Token caps from the command line refuse requests beyond them
    Given a worker on the reference model with flags "--max-tokens-out 5 --max-tokens-in 32"
    When I run the job:
      """
      {"job_id": "w1101-a", "prompt": "Hello there", "max_tokens": 5, "temperature": 0}
      """
    Then job "w1101-a" streamed started, at least 1 token and end
    When I post to /execute:
      """
      {"job_id": "w1101-b", "prompt": "Hello there", "max_tokens": 6}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "max_tokens"
    When I post to /execute:
      """
      {"job_id": "w1101-c", "prompt": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty", "max_tokens": 2}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "prompt"

  @M0-W-1110 @any
  Scenario: /health is refused until the model is loaded, then healthy
    When the worker is started on the "reference" model while polling /health
    Then /health was refused until the model was loaded and healthy after "ready"
    And the log events appear in order: "startup", "model_load_start", "model_load_complete", "ready"
    And the "ready" record carries the worker id

  @M0-W-1111 @any
  Scenario: A failed start logs one ERROR record with every fact and exits 1
    When the worker is started on the "bad-magic" model
    Then the worker exits with code 1 within 30 s
    And the worker logged an "error" record with code "MODEL_LOAD_FAILED" and fields "message", "gpu_device" and the model path
    And the worker did not panic

  @M0-W-1120 @bench
  Scenario: Cold start to ready is within budget
    When I time 5 cold starts of the worker to "ready"
    Then the "startup_s" budget holds for the maximum
