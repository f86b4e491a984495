"""A round trip between two simulated hosts (run by bench/netns.sh on each): host 0 accepts one TCP connection;
host 1 connects, times the handshake (one round trip) and prints `rtt SECONDS`."""

import os
import socket
import time

if __name__ == "__main__":
    if os.environ["NETNS_HOST"] == "0":
        with socket.create_server(("10.77.0.1", 5999)) as server:
            server.accept()[0].close()
    else:
        for _ in range(100):  # until host 0 listens
            try:
                t0 = time.perf_counter()
                socket.create_connection(("10.77.0.1", 5999), timeout=5).close()
                print(f"rtt {time.perf_counter() - t0:.4f}", flush=True)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
