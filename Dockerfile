# kubecell's image: the scheduler (`kubecell scheduler`), and later the extender and the node agent.
#   docker build -t <registry>/kubecell:0.1.0 .
# The testbed (Go) is not part of the image: it is for tests and demos on a workstation.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
# Non-root, as deploy/base/deployment.yaml's securityContext requires (runAsNonRoot, uid 65532).
USER 65532:65532
ENTRYPOINT ["kubecell"]
