"""Local Kafka: one KRaft node (broker and controller in one JVM) run from the Maven jars setup.sh fetched."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path

from common.flink import jar_dir
from featurectl.services.process import HOST, LocalService, LocalServiceError, port_open, require_java, spawn

JAVA_OPTS = ["-Xms256m", "-Xmx512m", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"]

# Kafka's log4j2 setup for a single local node: INFO to stdout, which `spawn` sends to kafka.log.
LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""


def cluster_id() -> str:
    """A fresh cluster id in Kafka's Uuid text form (url-safe base64 of 16 random bytes, unpadded)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class KafkaBroker(LocalService):
    name = "kafka"
    ready_timeout_s = 60.0
    stop_timeout_s = 30.0

    @property
    def props_file(self) -> Path:
        return self.dir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def marker(self) -> str:
        return str(self.props_file)

    @property
    def ports(self) -> list[int]:
        kafka = self.cfg.platform.kafka
        first = kafka.bootstrap_servers.split(",")[0]
        _, _, port = first.rpartition(":")
        if not port.isdigit():
            raise LocalServiceError(f"platform.kafka.bootstrap_servers `{kafka.bootstrap_servers}` is not host:port, "
                                    f"e.g. 127.0.0.1:19092")
        return [int(port), kafka.controller_port]

    def check_installed(self) -> None:
        folder = jar_dir("kafka")
        if not any(folder.glob("kafka_2.13-*.jar")):
            raise LocalServiceError(f"Kafka jars missing in {folder}: run scripts/setup.sh")
        require_java("Kafka needs Java 17 or newer")

    def server_properties(self) -> str:
        broker, controller = self.ports
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{controller}",
            "listeners": f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{broker}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def java(self, main_class: str, *args: str) -> list[str]:
        return ["java", *JAVA_OPTS, f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                "-cp", str(jar_dir("kafka") / "*"), main_class, *args]

    def format_storage(self) -> None:
        """Write the KRaft metadata (meta.properties) once; later starts reuse the same cluster id."""
        if (self.data_dir / "meta.properties").exists():
            return
        # `--cluster-id=ID`: an id may start with '-', which argparse would take for an option.
        argv = self.java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id()}",
                         "--config", str(self.props_file))
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise LocalServiceError(f"formatting Kafka storage in {self.data_dir} failed (exit {done.returncode}):\n"
                                    f"{done.stdout}{done.stderr}")

    def start(self) -> subprocess.Popen:
        self.props_file.write_text(self.server_properties())
        (self.dir / "log4j2.properties").write_text(LOG4J2)
        self.format_storage()
        return spawn(self.java("kafka.Kafka", str(self.props_file)), self.log_file, self.pid_file)

    def ready(self) -> bool:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        if not port_open(self.ports[0]):  # librdkafka would log every refused connection to stderr
            return False
        try:
            metadata = AdminClient({"bootstrap.servers": self.address}).list_topics(timeout=2)
        except KafkaException:
            return False
        return bool(metadata.brokers)

