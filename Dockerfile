# kubecell's image: the scheduler (`kubecell scheduler`), the extender (`kubecell extender`) and the node
# agent (`kubecell node-agent`).
#   docker build -t <registry>/kubecell:0.1.0 .
# The testbed (Go) is not part of the image: it is for tests and demos on a workstation.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
# The node extra brings grpcio and nvidia-ml-py; the kubelet API stubs are generated here, from the
# upstream protos (downloaded from the Go module proxy and checked against their SHA-256), so a node
# without internet access never needs to fetch them.
ENV KUBECELL_CACHE=/opt/kubecell/cache
RUN pip install --no-cache-dir ".[node]" && rm -rf /src \
    && python -c "from kubecell.node import protos; protos.deviceplugin(); protos.podresources()" \
    && chmod -R a+rX /opt/kubecell
WORKDIR /
# Non-root, as deploy/base/deployment.yaml's securityContext requires (runAsNonRoot, uid 65532); the node
# agent's DaemonSet runs it as root (the kubelet's socket directories are root-owned).
USER 65532:65532
ENTRYPOINT ["kubecell"]
