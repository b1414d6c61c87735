Feature: Structured output
  /execute's json_schema, regex and grammar and the OpenAI response_format, enforced token by
  token over the model's own vocabulary (issue 43): every sampled output keeps to its constraint
  and ends complete; what cannot be enforced is refused naming its field, never ignored.

  @EXT-043.3 @any
  Scenario: Sampled jobs under a JSON Schema or a regex keep to it and end complete
    Given a worker on the reference model
    When I run this job with seeds 1 to 4:
      """
      {"job_id": "person", "temperature": 1.0, "max_tokens": 300,
       "messages": [{"role": "user", "content": "Describe a person as JSON."}],
       "json_schema": {"type": "object",
         "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 24},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120},
                        "role": {"enum": ["pilot", "chef", "poet"]},
                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
                        "email": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}]}},
         "required": ["name", "age", "role", "tags", "email"], "additionalProperties": false}}
      """
    Then every run's text is JSON that its json_schema validates
    When I run this job with seeds 5 to 8:
      """
      {"job_id": "date", "temperature": 1.0, "max_tokens": 40,
       "prompt": "The date today is", "regex": " ?[0-9]{4}-(0[1-9]|1[0-2])-[0-3][0-9]"}
      """
    Then every run's text matches its regex in whole

  @EXT-043.4 @any
  Scenario: A chat under an OpenAI response_format answers JSON its schema validates
    Given a worker on the reference model
    Then a chat under this response_format gives JSON its schema validates with seeds 1 to 3:
      """
      {"messages": [{"role": "user", "content": "Give me a city and its country."}],
       "temperature": 1.0, "max_tokens": 200,
       "response_format": {"type": "json_schema", "json_schema": {"name": "place", "strict": true,
         "schema": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 20},
                                   "country": {"type": "string", "maxLength": 20},
                                   "population_millions": {"type": "number", "minimum": 0, "maximum": 40}},
                    "required": ["city", "country", "population_millions"],
                    "additionalProperties": false}}}}
      """

  @EXT-043.5 @any
  Scenario: A constraint that cannot be enforced is refused naming its field
    Given a worker on the reference model
    When I post to /execute:
      """
      {"job_id": "bad-schema", "prompt": "x", "json_schema": {"type": "array", "uniqueItems": true}}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "uniqueItems"
    When I post to /execute:
      """
      {"job_id": "two", "prompt": "x", "regex": "a+", "grammar": "start: \"a\""}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "at most one of json_schema, regex and grammar"
    When I post to /execute:
      """
      {"job_id": "bad-regex", "prompt": "x", "regex": "(unclosed"}
      """
    Then the reply is 400 "INVALID_REQUEST" naming "regex"
    And /health says "healthy"
