#!/bin/sh
# An ACP agent for bench/waiting_sessions.py --acp: it asks its client's permission for a tool of its
# own (a person's approval in oz0), then ends its turn saying so. oz0's requests are numbered 0
# (initialize), 1 (session/new) and 2 (session/prompt).
read -r initialize
echo '{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":1,"agentCapabilities":{}}}'
read -r new_session
echo '{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s1"}}'
read -r prompt
echo '{"jsonrpc":"2.0","id":"p","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1","title":"Ship it","kind":"execute"},"options":[{"optionId":"once","name":"Allow","kind":"allow_once"},{"optionId":"no","name":"Reject","kind":"reject_once"}]}}'
read -r answer
echo '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"shipped"}}}}'
echo '{"jsonrpc":"2.0","id":2,"result":{"stopReason":"end_turn"}}'
read -r end
