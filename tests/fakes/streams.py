"""ScriptedCall: a NAMED FAKE of a gRPC stream-stream call, for unit tests of the pipelined clients
(bookie_client.AddStream, broker_client.AppendStream): it reads the requests the client sends, then answers as the
test scripts."""
from __future__ import annotations


class ScriptedCall:
    """Reads `expected` requests the client sends, then yields the messages `answer(requests)` gives."""

    def __init__(self, requests, expected: int, answer) -> None:
        self._requests, self._expected, self._answer = requests, expected, answer

    def __aiter__(self):
        return self._answers()

    def cancel(self) -> None:
        pass

    async def _answers(self):
        taken = []
        async for request in self._requests:
            taken.append(request)
            if len(taken) == self._expected:
                break
        for message in self._answer(taken):
            yield message
