Feature: Logit bias and penalties
  OpenAI's logit_bias, presence_penalty and frequency_penalty on /execute and the OpenAI routes
  (issue 43): added to the logits before the sampling pipeline, the same on the CPU and the GPU.

  @EXT-043.13 @any
  Scenario: logit_bias lifts or bans a token and the penalties cut repetition
    Given a worker on the reference model
    When I run the job:
      """
      {"job_id": "plain", "prompt": "one one one one one one one one", "temperature": 0, "max_tokens": 24}
      """
    And I run the job:
      """
      {"job_id": "penalized", "prompt": "one one one one one one one one", "temperature": 0, "max_tokens": 24,
       "presence_penalty": 2.0, "frequency_penalty": 2.0}
      """
    Then job "penalized" repeats fewer tokens than job "plain"
    When I rerun job "plain" as "banned" with its first token banned
    Then job "banned" never streamed job "plain"'s first token
    When I run the job:
      """
      {"job_id": "lifted", "prompt": "Hello", "temperature": 1.0, "seed": 3, "max_tokens": 8,
       "logit_bias": {"28": 100}}
      """
    Then every token of job "lifted" is token 28
    When I post to /execute:
      """
      {"job_id": "bad-bias", "prompt": "x", "logit_bias": {"99999999": 1}, "presence_penalty": 3}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "logit_bias"
    And /health says "healthy"
