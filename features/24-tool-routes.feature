Feature: Tool use on /v1/messages and /v1/responses
  Anthropic's tools, tool_choice and tool_use/tool_result blocks, and the Responses API's
  function tools and function_call/function_call_output items, read into the chat route's
  tools: the same template rendering (the reference model's template ignores tools, so the
  worker writes them the Hermes way), the same grammar for forced calls, the same parser; the
  calls answered in each API's shapes, whole and streamed (issue 43).

  @EXT-043.9 @any
  Scenario: Anthropic tool definitions, choices and blocks are honoured or refused by name
    Given a worker on the reference model
    Then /v1/messages answers 400 "invalid_request_error" naming "tools[0].type" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
      """
    And /v1/messages answers 400 "invalid_request_error" naming "tools[0].input_schema" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": [{"name": "now"}]}
      """
    And /v1/messages answers 400 "invalid_request_error" naming "tool_choice" for:
      """
      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
       "tools": [{"name": "now", "input_schema": {"type": "object"}}],
       "tool_choice": {"type": "tool", "name": "later"}}
      """
    And /v1/messages answers 400 "invalid_request_error" naming "messages" for:
      """
      {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}]}],
       "max_tokens": 4}
      """
    When I post this with tools to /v1/messages whole and streamed, seeds "1, 2, 3":
      """
      {"messages": [
         {"role": "user", "content": "What is the weather in Paris?"},
         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
           "input": {"city": "Paris", "unit": "celsius"}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "22 C, sunny"}]}],
       "tools": [{"name": "get_weather", "description": "The weather in a city",
         "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": false}}],
       "max_tokens": 48, "temperature": 1}
      """
    Then every answer is text or tool uses that parse, whole and streamed alike

  @EXT-043.10 @any
  Scenario: With tool_choice any or a named tool, every tool_use block fits its input_schema
    Given a worker on the reference model
    When I post this with tools to /v1/messages whole and streamed, seeds "1, 2, 3, 4, 5":
      """
      {"messages": [{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
       "tools": [
         {"name": "get_weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}},
         {"name": "get_time", "description": "The time in a timezone",
          "input_schema": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"], "additionalProperties": false}}],
       "tool_choice": {"type": "any", "disable_parallel_tool_use": true}, "max_tokens": 128, "temperature": 1}
      """
    Then every answer uses "get_weather, get_time" with input valid under its schema and stops with "tool_use", whole and streamed alike
    When I post this with tools to /v1/messages whole and streamed, seeds "1, 2, 3":
      """
      {"messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
       "tools": [
         {"name": "get_weather", "input_schema": {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"], "additionalProperties": false}},
         {"name": "get_time", "input_schema": {"type": "object",
           "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"], "additionalProperties": false}}],
       "tool_choice": {"type": "tool", "name": "get_time", "disable_parallel_tool_use": true},
       "max_tokens": 128, "temperature": 1}
      """
    Then every answer uses "get_time" with input valid under its schema and stops with "tool_use", whole and streamed alike

  @EXT-043.11 @any
  Scenario: Responses function tools and call items are honoured, other tool types refused by name
    Given a worker on the reference model
    Then /v1/responses answers 400 naming "tools[0].type" for:
      """
      {"input": "hi", "tools": [{"type": "web_search"}]}
      """
    And /v1/responses answers 400 naming "tool_choice" for:
      """
      {"input": "hi", "tools": [{"type": "function", "name": "now"}],
       "tool_choice": {"type": "function", "name": "later"}}
      """
    And /v1/responses answers 400 naming "input" for:
      """
      {"input": [{"type": "function_call_output", "output": "22 C"}]}
      """
    When I post this with tools to /v1/responses whole and streamed, seeds "1, 2, 3":
      """
      {"input": [
         {"role": "user", "content": "What is the weather in Paris?"},
         {"type": "function_call", "call_id": "call_1", "name": "get_weather",
          "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"},
         {"type": "function_call_output", "call_id": "call_1", "output": "22 C, sunny"}],
       "tools": [{"type": "function", "name": "get_weather", "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": false}}],
       "max_output_tokens": 48, "temperature": 1}
      """
    Then every answer is text or tool uses that parse, whole and streamed alike

  @EXT-043.12 @any
  Scenario: With tool_choice required or a named function, every function_call fits its parameters
    Given a worker on the reference model
    When I post this with tools to /v1/responses whole and streamed, seeds "1, 2, 3, 4, 5":
      """
      {"input": "What is the weather in Paris, in celsius?",
       "tools": [
         {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": true,
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}},
         {"type": "function", "name": "get_time", "description": "The time in a timezone", "strict": true,
          "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
            "required": ["timezone"], "additionalProperties": false}}],
       "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 128, "temperature": 1}
      """
    Then every answer uses "get_weather, get_time" with input valid under its schema and stops with "completed", whole and streamed alike
    When I post this with tools to /v1/responses whole and streamed, seeds "1, 2, 3":
      """
      {"input": "What time is it in Tokyo?",
       "tools": [
         {"type": "function", "name": "get_weather", "parameters": {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"], "additionalProperties": false}},
         {"type": "function", "name": "get_time", "parameters": {"type": "object",
           "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"], "additionalProperties": false}}],
       "tool_choice": {"type": "function", "name": "get_time"}, "parallel_tool_calls": false,
       "max_output_tokens": 128, "temperature": 1}
      """
    Then every answer uses "get_time" with input valid under its schema and stops with "completed", whole and streamed alike
