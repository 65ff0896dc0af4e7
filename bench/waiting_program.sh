#!/bin/sh
# A JSON-lines harness (protocol 1) for bench/waiting_sessions.py: it asks a person, then ends with the answer.
read -r start
echo '{"type":"call","id":"q","tool":"oz.ask","args":{"question":"Ship it?"}}'
read -r answer
echo "{\"type\":\"done\",\"output\":$answer}"
