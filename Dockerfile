# One image with every attune binary; docker-compose.yml picks the command per service.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --workspace --bins \
 && mkdir /out && cp target/release/attune target/release/attune-api target/release/attune-executor target/release/attune-worker target/release/attune-bench /out/

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* && useradd --system --home /var/lib/attune attune
COPY --from=build /out/ /usr/local/bin/
COPY packs /packs
COPY migrations /migrations
ENV ATTUNE_PACKS_DIR=/packs
USER attune
EXPOSE 8080
CMD ["attune-api"]
