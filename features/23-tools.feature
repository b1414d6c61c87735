Feature: OpenAI tool calls
  tools, tool_choice and parallel_tool_calls on /v1/chat/completions, driven by the
  async-openai client: definitions rendered by the model's chat template (the reference
  model's template ignores tools, so the worker writes them the Hermes way), calls read
  from the model's output in its format and answered as tool_calls, whole and streamed
  (issue 43).

  @EXT-043.6 @any
  Scenario: Tool definitions and choices that cannot be honoured are refused, naming the field
    Given a worker on the reference model
    Then the async-openai client gets 400 naming "tools[0].function.name" for:
      """
      {"messages": [{"role": "user", "content": "hi"}],
       "tools": [{"type": "function", "function": {"name": "get weather"}}]}
      """
    And the async-openai client gets 400 naming "tools[1].function.name" for:
      """
      {"messages": [{"role": "user", "content": "hi"}],
       "tools": [{"type": "function", "function": {"name": "now"}}, {"type": "function", "function": {"name": "now"}}]}
      """
    And the async-openai client gets 400 naming "tool_choice" for:
      """
      {"messages": [{"role": "user", "content": "hi"}],
       "tools": [{"type": "function", "function": {"name": "now"}}],
       "tool_choice": {"type": "function", "function": {"name": "later"}}}
      """
    And the async-openai client gets 400 naming "messages" for:
      """
      {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]}
      """

  @EXT-043.7 @any
  Scenario: A conversation holding a call and its result is answered, whole and streamed alike
    Given a worker on the reference model
    When the async-openai client runs this chat with tools whole and streamed, seeds "1, 2, 3":
      """
      {"messages": [
         {"role": "user", "content": "What is the weather in Paris?"},
         {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"}],
       "tools": [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": false}}}],
       "max_tokens": 48, "temperature": 1}
      """
    Then every answer is text or calls that parse, whole and streamed alike

  @EXT-043.8 @any
  Scenario: With tool_choice required or a named function, every call parses and fits its tool's parameters
    Given a worker on the reference model
    When the async-openai client runs this chat with tools whole and streamed, seeds "1, 2, 3, 4, 5":
      """
      {"messages": [{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
       "tools": [
         {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 40},
             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
             "required": ["city", "unit"], "additionalProperties": false}}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone",
           "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
             "required": ["timezone"], "additionalProperties": false}}}],
       "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 128, "temperature": 1}
      """
    Then every answer calls "get_weather, get_time" with arguments valid under its parameters, whole and streamed alike
    When the async-openai client runs this chat with tools whole and streamed, seeds "1, 2, 3":
      """
      {"messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
       "tools": [
         {"type": "function", "function": {"name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
             "required": ["city"], "additionalProperties": false}}},
         {"type": "function", "function": {"name": "get_time",
           "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
             "required": ["timezone"], "additionalProperties": false}}}],
       "tool_choice": {"type": "function", "function": {"name": "get_time"}},
       "parallel_tool_calls": false, "max_tokens": 128, "temperature": 1}
      """
    Then every answer calls "get_time" with arguments valid under its parameters, whole and streamed alike
