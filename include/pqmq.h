/*
 * pqmq.h: an ordered message queue inside PostgreSQL.
 *
 * This header is the whole public API; nothing outside it is API. It is
 * grouped by the library file that implements each part.
 *
 * Conventions
 *   - Functions that can fail return 0 (PQMQ_OK) or a negative PQMQ_E* code.
 *     The message (with the server's SQLSTATE where there is one) is then in
 *     pqmq_errmsg(client) until the next call on that client.
 *   - Ownership is stated at every declaration: "caller owns; free with X"
 *     or "borrowed; valid until Y". Every _free(NULL) is a no-op.
 *   - Durations cross the API as int64_t milliseconds, ids as uuid_t.
 *   - A client is used by one thread at a time, like a PGconn. After fork(),
 *     a child must not use its parent's clients: it connects anew.
 */
#ifndef PQMQ_H
#define PQMQ_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <msgpack.h>
#include <uuid/uuid.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PQMQ_BUILDING) && defined(__GNUC__)
#define PQMQ_EXPORT __attribute__((visibility("default")))
#else
#define PQMQ_EXPORT
#endif

/* ---- errors (error.c) -------------------------------------------------- */

/* Error codes. Values may be added in later versions; a value is never
 * renumbered or reused, so codes may be stored and compared across
 * versions. Treat an unknown negative code as an error (pqmq_strerror says
 * "unknown error").
 *
 * PQMQ_ENOTHELD and PQMQ_ESTALE both say "not yours", of different calls.
 * PQMQ_ENOTHELD comes from calls on one message by id (pqmq_fail,
 * pqmq_checkpoint, pqmq_ctx_checkpoint): the message is gone or no lease on
 * it is current, and nothing changed. PQMQ_ESTALE comes from calls that settle a batch's
 * deliveries, fenced by attempt (pqmq_complete_batch,
 * pqmq_complete_and_poll, pqmq_complete_commit): some jobs were delivered
 * again since; the others were settled (pqmq_complete_commit: none, it is
 * all or nothing), and the message says how many were stale. */
enum {
    PQMQ_OK = 0,
    PQMQ_EINVAL = -1,   /* a bad argument; the message names it */
    PQMQ_ENOMEM = -2,   /* out of memory */
    PQMQ_ECONN = -3,    /* no usable connection (failed, broken or lost), or a commit of
                           unknown outcome (a Citus worker lost in it): retry */
    PQMQ_ESERVER = -4,  /* the server refused; see pqmq_sqlstate() */
    PQMQ_ETOOBIG = -5,  /* over a documented limit (batch or payload size) */
    PQMQ_ENOTHELD = -6, /* the message is gone or its lease ran out */
    PQMQ_EPAYLOAD = -7, /* a payload that does not decode */
    PQMQ_ESCHEMA = -8,  /* the queue's schema is missing: run pqmq_migrate */
    PQMQ_ESTALE = -9    /* the message was delivered again since: not yours */
};

/* Limits; the server enforces the same ones (SQL function _mq_limits). */
#define PQMQ_MAX_BATCH 10000                       /* messages per insert/poll */
#define PQMQ_MAX_PAYLOAD (16 * 1024 * 1024)        /* bytes, JSON and binary each */
#define PQMQ_MAX_DURATION_MS (3650LL * 86400000LL) /* ten years */

/* A static description of an error code, e.g. "bad argument". Never NULL. */
PQMQ_EXPORT const char *pqmq_strerror(int code);

/* ---- client (client.c) ------------------------------------------------- */

typedef struct pqmq_client pqmq_client;

/*
 * Connects with a libpq conninfo string (NULL or "" uses libpq's
 * environment). *out is set even on failure, so that pqmq_errmsg() can say
 * why; it is NULL only if memory ran out.
 * Returns 0, PQMQ_ECONN or PQMQ_ENOMEM.
 * Caller owns *out; free with pqmq_client_free.
 */
PQMQ_EXPORT int pqmq_connect(const char *conninfo, pqmq_client **out);

/*
 * Wraps a connection the caller opened, so that pqmq calls run inside the
 * caller's own transactions. The client borrows conn: conn must outlive the
 * client and is never closed by it. Returns 0, PQMQ_EINVAL or PQMQ_ENOMEM.
 * Caller owns *out; free with pqmq_client_free.
 */
PQMQ_EXPORT int pqmq_wrap(PGconn *conn, pqmq_client **out);

/* Frees the client; closes the connection only if pqmq_connect opened it. */
PQMQ_EXPORT void pqmq_client_free(pqmq_client *client);

/* Re-establishes a connection that pqmq_connect opened (after PQMQ_ECONN).
 * Returns 0, PQMQ_ECONN, or PQMQ_EINVAL for a borrowed connection. */
PQMQ_EXPORT int pqmq_reconnect(pqmq_client *client);

/* The connection. Borrowed; valid until pqmq_client_free. */
PQMQ_EXPORT PGconn *pqmq_conn(pqmq_client *client);

/* The last error's message, "" after success. Borrowed; valid until the next
 * call on this client. Never NULL (also for a NULL client). */
PQMQ_EXPORT const char *pqmq_errmsg(const pqmq_client *client);

/* The last error's SQLSTATE ("" when the server did not send one). Borrowed;
 * valid until the next call on this client. Never NULL. */
PQMQ_EXPORT const char *pqmq_sqlstate(const pqmq_client *client);

/* ---- logs (log.c) -------------------------------------------------------- */

/* Log levels, most severe first. */
enum {
    PQMQ_LOG_ERROR = 0, /* something failed and was not handled */
    PQMQ_LOG_WARN = 1,  /* something failed and is being handled (a lost connection) */
    PQMQ_LOG_INFO = 2,  /* a change of state (a connection re-established, start, stop) */
    PQMQ_LOG_DEBUG = 3  /* detail (each failed reconnect attempt of a worker) */
};

/*
 * A log function: level is a PQMQ_LOG_* value, msg one line of text
 * without a trailing newline (borrowed; valid until fn returns), ctx what
 * was given with fn. fn must not call back into the client or runner that
 * logs.
 */
typedef void (*pqmq_log_fn)(void *ctx, int level, const char *msg);

/* The name of a level: "error", "warn", "info", "debug" ("unknown" for
 * another value). Static. */
PQMQ_EXPORT const char *pqmq_log_level_name(int level);

/*
 * Sends the server's notices and warnings on a connection pqmq_connect
 * opened to fn (e.g. "WARNING:  ..." at PQMQ_LOG_WARN; ERROR, FATAL and
 * PANIC at PQMQ_LOG_ERROR, NOTICE, INFO and LOG at PQMQ_LOG_INFO), called
 * on the thread using the client. Without one (the default, or fn NULL)
 * they go to libpq's notice receiver, which prints them on stderr unless
 * the application set its own on pqmq_conn(client); pqmq itself prints
 * nothing. A pqmq_wrap client's notices stay the caller's connection's.
 * ctx is borrowed and passed through; it must outlive the client or the
 * next pqmq_set_log. Returns 0 or PQMQ_EINVAL (client NULL).
 */
PQMQ_EXPORT int pqmq_set_log(pqmq_client *client, pqmq_log_fn fn, void *ctx);

/* ---- migrations (migrate.c) -------------------------------------------- */

/*
 * Creates or upgrades the queue's schema in the client's current schema
 * (the first schema of its search_path), in one transaction under an
 * advisory lock: a new schema gets this release's schema; a queue made by
 * an earlier release (or by the original sqlxmq schema) is upgraded in
 * place, keeping its messages; a queue already at this release is left as
 * it is. The version reached is recorded in mq_schema_migrations. Safe to
 * run concurrently and repeatedly. Must be called outside a transaction.
 * On a current queue it changes nothing, and a role that holds any duty
 * (mq_grant) may call it: it reads the version through mq_schema_version().
 * Returns 0 or a negative code (the server's refusal of a version it cannot
 * upgrade is in pqmq_errmsg).
 */
PQMQ_EXPORT int pqmq_migrate(pqmq_client *client);
/*
 * pqmq_migrate in schema (NULL: the current schema), which it selects for
 * its own transaction only: the way to name the schema through a pooler in
 * transaction mode, which keeps no session setting. schema is borrowed.
 */
PQMQ_EXPORT int pqmq_migrate_schema(pqmq_client *client, const char *schema);

/* The schema version this library installs (100 for release 1.0.0). */
PQMQ_EXPORT int pqmq_schema_version(void);

/* The i-th embedded SQL file (0-based, in the order pqmq_migrate applies
 * them): the schema version it belongs to, its name (e.g. "schema/poll",
 * "migrations/0.1.0_to_1.0.0") and its SQL text, as pqmq_migrate applies it
 * in the target schema. Any pointer may be NULL. Strings are static.
 * Returns 0, or PQMQ_EINVAL when i is past the last one. */
PQMQ_EXPORT int pqmq_migration_info(size_t i, int *version, const char **name,
                                    const char **sql);

/* ---- messages (msg.c) -------------------------------------------------- */

typedef struct pqmq_msg pqmq_msg;

/*
 * A new message with a fresh time-ordered id and defaults: channel unset,
 * args "", name "", no payload, no delay, 4 retries, 1 s initial backoff,
 * no commit interval, unordered. Returns NULL if memory ran out.
 * Caller owns; free with pqmq_msg_free.
 *
 * Setters copy their arguments and return 0, PQMQ_EINVAL (NULL msg) or
 * PQMQ_ENOMEM. Values are checked by pqmq_insert, which names the bad field.
 */
PQMQ_EXPORT pqmq_msg *pqmq_msg_new(void);
PQMQ_EXPORT void pqmq_msg_free(pqmq_msg *msg);

/* The channel and its arguments (args NULL means ""). "" is a channel like
 * any other (sqlxmq's default). Messages of one (channel, args) that are
 * ordered form one chain. */
PQMQ_EXPORT int pqmq_msg_set_channel(pqmq_msg *msg, const char *channel, const char *args);
/* The message name: the runner dispatches on it. NULL means "". */
PQMQ_EXPORT int pqmq_msg_set_name(pqmq_msg *msg, const char *name);
/* A JSON payload (NUL-terminated text; validated). NULL clears it. */
PQMQ_EXPORT int pqmq_msg_set_json(pqmq_msg *msg, const char *json);
/* A binary payload of len bytes. NULL clears it. */
PQMQ_EXPORT int pqmq_msg_set_bytes(pqmq_msg *msg, const void *data, size_t len);
/* A binary payload from a msgpack buffer (copied). */
PQMQ_EXPORT int pqmq_msg_set_msgpack(pqmq_msg *msg, const msgpack_sbuffer *buf);
/* Not ready before delay_ms from insertion. */
PQMQ_EXPORT int pqmq_msg_set_delay(pqmq_msg *msg, int64_t delay_ms);
/* Deliveries after the first one that a failure may cause (>= 0). */
PQMQ_EXPORT int pqmq_msg_set_retries(pqmq_msg *msg, int retries);
/* The first lease and retry delay; doubles at every delivery (> 0). */
PQMQ_EXPORT int pqmq_msg_set_backoff(pqmq_msg *msg, int64_t backoff_ms);
/* Two-phase: invisible until pqmq_commit, or until interval_ms has passed
 * (then delivered with is_committed false). A negative value disables it. */
PQMQ_EXPORT int pqmq_msg_set_commit_interval(pqmq_msg *msg, int64_t interval_ms);
/* Ordered: delivered after every earlier ordered message of its chain has
 * been completed (deleted), one at a time. */
PQMQ_EXPORT int pqmq_msg_set_ordered(pqmq_msg *msg, int ordered);
/* Replaces the generated id (e.g. for idempotent producers). */
PQMQ_EXPORT int pqmq_msg_set_id(pqmq_msg *msg, const uuid_t id);
/* Copies the message's id into out. */
PQMQ_EXPORT void pqmq_msg_id(const pqmq_msg *msg, uuid_t out);
/* A unique key (1..1024 bytes of UTF-8): while a message with this key is
 * live in the channel (queued, scheduled, in flight or uncommitted; a dead
 * letter is not), inserting another one with it does not create a second
 * message (see pqmq_insert_unique). NULL clears it. */
PQMQ_EXPORT int pqmq_msg_set_unique_key(pqmq_msg *msg, const char *key);
/* The highest priority a message may have. */
#define PQMQ_MAX_PRIORITY 32767
/* Priority, 0..PQMQ_MAX_PRIORITY (default 0, the lowest): among the ready
 * messages of a channel, higher priorities are delivered first, then in
 * the order they became ready. Channels stay fair to each other, and an
 * ordered chain is never reordered (its messages become ready one at a
 * time). */
PQMQ_EXPORT int pqmq_msg_set_priority(pqmq_msg *msg, int priority);

/* ---- producing (produce.c) --------------------------------------------- */

/*
 * Inserts n messages in one round trip and one statement: all of them or,
 * on any error, none. Runs in the connection's current transaction if one is
 * open (the messages then exist only if it commits). Ordered messages of a
 * chain keep the order of msgs. 1 <= n <= PQMQ_MAX_BATCH.
 * Returns 0, PQMQ_EINVAL (names the message and field), PQMQ_ETOOBIG,
 * PQMQ_ECONN, PQMQ_ESERVER or PQMQ_ESCHEMA. msgs stay owned by the caller.
 */
PQMQ_EXPORT int pqmq_insert(pqmq_client *client, pqmq_msg *const *msgs, size_t n);

/*
 * Inserts nbatches batches (batches[k] holds counts[k] messages, as for
 * pqmq_insert) in one round trip, libpq's pipeline mode, each in a
 * transaction of its own: a batch is all there or not at all, and one
 * batch's failure does not undo the others. For producers with many
 * batches: their round trips and their commits' waits overlap. Every batch
 * is checked first; a bad message refuses them all, unsent, naming the
 * batch and the message. Needs no transaction open (PQMQ_EINVAL).
 * 1 <= nbatches <= PQMQ_MAX_BATCH. rcs (may be NULL; nbatches entries)
 * receives each batch's outcome: 0 committed, or what pqmq_insert would
 * have returned (PQMQ_ECONN: unknown, the connection was lost). Returns 0
 * when every batch committed, else the first failure's code (pqmq_errmsg
 * names its batch). The messages stay the caller's.
 */
PQMQ_EXPORT int pqmq_insert_batches(pqmq_client *client, pqmq_msg *const *const *batches,
                                    const size_t *counts, size_t nbatches, int *rcs);

/* ---- unique keys (unique.c) --------------------------------------------- */

/* What a second insert of a live key does with the message holding it. */
typedef enum {
    PQMQ_KEY_KEEP = 0,           /* leave it as it is */
    PQMQ_KEY_REPLACE = 1,        /* if not started: new name, payload and delay */
    PQMQ_KEY_REPLACE_PAYLOAD = 2 /* if not started: new name and payload only */
} pqmq_key_mode;

/* What an insert did with one message. */
typedef enum {
    PQMQ_INSERTED = 0, /* a new message (its own id) */
    PQMQ_KEPT = 1,     /* not inserted: the key's holder stays as it was */
    PQMQ_REPLACED = 2  /* not inserted: the holder, not yet started, took its payload */
} pqmq_outcome;

typedef struct {
    pqmq_outcome outcome;
    uuid_t id; /* the message inserted, or the key's holder */
} pqmq_insert_result;

/*
 * Inserts n messages as pqmq_insert does (one statement, all or nothing,
 * in the open transaction if any), where a message whose unique key is
 * held is not inserted: mode says what happens to the holder instead. A
 * holder that has started (delivered, or held by a consumer) is never
 * changed: it is kept. The batch counts as inserted in order: a later
 * message with a key an earlier one took is kept, or replaces it.
 * retention_ms > 0 keeps each key that long after its message is completed
 * or deleted (an insert meanwhile is kept, with the completed message's id):
 * an idempotency key. 0: the key is free once its message is gone.
 * results (may be NULL) receives n entries, in batch order. pqmq_insert
 * and pqmq_insert_batches insert keyed messages as this does with
 * PQMQ_KEY_KEEP and no retention. Returns 0 or what pqmq_insert returns (PQMQ_EINVAL also for
 * a bad mode or retention). msgs and results stay the caller's.
 */
PQMQ_EXPORT int pqmq_insert_unique(pqmq_client *client, pqmq_msg *const *msgs, size_t n,
                                   pqmq_key_mode mode, int64_t retention_ms,
                                   pqmq_insert_result *results);

/* Second phase: makes two-phase messages ready now. Unknown or already
 * committed ids are ignored. Returns 0 or a negative code. */
PQMQ_EXPORT int pqmq_commit(pqmq_client *client, const uuid_t *ids, size_t n);

/* ---- consuming: polling (consume.c) ----------------------------------- */

typedef struct pqmq_batch pqmq_batch;
typedef struct pqmq_job pqmq_job;

/*
 * Claims up to batch_size ready messages of the given channels (channels
 * NULL: all channels) and leases them for their current backoff.
 * On success *out holds 0..batch_size jobs; when it holds none,
 * pqmq_batch_wait_ms() tells how long until something becomes ready.
 * Returns 0 or a negative code (*out is then NULL).
 * Caller owns *out; free with pqmq_batch_free.
 */
PQMQ_EXPORT int pqmq_poll(pqmq_client *client, const char *const *channels, size_t nchannels,
                          int batch_size, pqmq_batch **out);

/*
 * The locked lane, for short handlers and exactly-once work: claims up to
 * batch_size first deliveries for the connection's transaction and writes
 * nothing. With no transaction open it opens one (BEGIN, in the same round
 * trip); a failed one is refused (PQMQ_EINVAL). The jobs are held by that
 * transaction's row locks: do your writes in it, then pqmq_complete_commit
 * (or pqmq_complete_batch and COMMIT), so your writes and the completion
 * commit together, one commit per batch. pqmq_fail in that transaction
 * counts a failed attempt. A rollback, a crash or a lost connection makes
 * the jobs ready again at once, with no attempt spent; such a message, and
 * every retry, is delivered from then on by pqmq_poll only, whose lease
 * counts the attempt before your code runs, so a message that kills its
 * consumer still ends dead. A consumer of this lane also calls pqmq_poll,
 * at least whenever this returns fewer jobs than it asked for. Hold the
 * transaction briefly: it holds back vacuum like any other.
 * Returns 0 or a negative code (*out is then NULL, and a transaction this
 * call opened is rolled back). Caller owns *out; free with pqmq_batch_free.
 */
PQMQ_EXPORT int pqmq_poll_locked(pqmq_client *client, const char *const *channels,
                                 size_t nchannels, int batch_size, pqmq_batch **out);

/*
 * Completes every job of batch (fenced by attempt, as pqmq_complete_batch)
 * and commits the connection's open transaction, in one round trip: all of
 * it or none. If any job is no longer this delivery's (its lease ran out
 * and it went to another consumer, or it is gone), nothing is committed:
 * the transaction is rolled back and PQMQ_ESTALE returned, so effects of a
 * message that is not yours never commit. Any other error also rolls back.
 * No transaction open: PQMQ_EINVAL. An empty batch just commits. batch
 * stays the caller's.
 */
PQMQ_EXPORT int pqmq_complete_commit(pqmq_client *client, const pqmq_batch *batch);

/* ---- batches and jobs (job.c) ------------------------------------------ */

PQMQ_EXPORT void pqmq_batch_free(pqmq_batch *batch);
PQMQ_EXPORT size_t pqmq_batch_count(const pqmq_batch *batch);
/* Job i (0-based). Borrowed; valid until pqmq_batch_free. NULL if out of
 * range. */
PQMQ_EXPORT const pqmq_job *pqmq_batch_job(const pqmq_batch *batch, size_t i);
/* For an empty batch: milliseconds until the earliest matching message
 * becomes ready (0: poll again now; at most 5000 while a message is in
 * flight whose lease ends later), or -1 when there is none at all. */
PQMQ_EXPORT int64_t pqmq_batch_wait_ms(const pqmq_batch *batch);

/* Job accessors. Strings and bytes are borrowed; valid until the batch is
 * freed. */
PQMQ_EXPORT void pqmq_job_id(const pqmq_job *job, uuid_t out);
PQMQ_EXPORT const char *pqmq_job_name(const pqmq_job *job);
PQMQ_EXPORT const char *pqmq_job_channel(const pqmq_job *job);
PQMQ_EXPORT const char *pqmq_job_args(const pqmq_job *job);
/* The JSON payload as text, or NULL when the message has none. */
PQMQ_EXPORT const char *pqmq_job_json(const pqmq_job *job);
/* The binary payload (NULL with *len 0 when there is none). */
PQMQ_EXPORT const void *pqmq_job_bytes(const pqmq_job *job, size_t *len);
/* 0 for a two-phase message delivered because its commit interval ran out. */
PQMQ_EXPORT int pqmq_job_is_committed(const pqmq_job *job);
/* 1 for the first delivery, 2 for the first retry, ... */
PQMQ_EXPORT int pqmq_job_attempt(const pqmq_job *job);
/* Deliveries still possible after this one (0: this is the last attempt). */
PQMQ_EXPORT int pqmq_job_retries_left(const pqmq_job *job);
/* Length of this delivery's lease, in milliseconds. */
PQMQ_EXPORT int64_t pqmq_job_lease_ms(const pqmq_job *job);
/* For dead letters: the last recorded failure (NULL: none), and whether the
 * message still blocks its ordered chain. */
PQMQ_EXPORT const char *pqmq_job_last_error(const pqmq_job *job);
PQMQ_EXPORT int pqmq_job_blocking(const pqmq_job *job);

/* ---- consuming: settling jobs (consume.c) ------------------------------ */

/*
 * Completes (deletes) n messages in one round trip. Inside the caller's
 * transaction (see pqmq_wrap) the completion commits with the caller's own
 * writes: that is how effects happen exactly once. Completing a member of an
 * ordered chain releases the next one. Unknown ids are ignored.
 * Returns 0 or a negative code.
 */
PQMQ_EXPORT int pqmq_complete(pqmq_client *client, const uuid_t *ids, size_t n);

/* Completes every job of the batch in one round trip, fenced by attempt: a
 * job whose lease ran out and that was delivered again (to anyone) is left
 * to its new owner. Returns 0, PQMQ_ESTALE (the others were completed; the
 * message says how many were stale) or a negative code. */
PQMQ_EXPORT int pqmq_complete_batch(pqmq_client *client, const pqmq_batch *batch);

/*
 * Records why this attempt failed (error may be NULL) and schedules the
 * retry one backoff from now; with no retries left the message is dead
 * (kept, never delivered again). Returns 0, PQMQ_ENOTHELD (the lease ran
 * out or the message is gone), or a negative code.
 */
PQMQ_EXPORT int pqmq_fail(pqmq_client *client, const uuid_t id, const char *error);

/*
 * Extends the leases of in-flight messages to now + duration_ms (never
 * shortens one). Messages whose lease already ran out are not touched.
 * *extended (may be NULL) receives how many were extended.
 * Returns 0 or a negative code.
 */
PQMQ_EXPORT int pqmq_keep_alive(pqmq_client *client, const uuid_t *ids, size_t n,
                                int64_t duration_ms, size_t *extended);

/*
 * Saves progress of a long job: extends its lease like pqmq_keep_alive,
 * replaces its payload where json (NUL-terminated) or bytes (len bytes) is
 * non-NULL, and grants extra_retries (>= 0) more deliveries. Returns 0,
 * PQMQ_ENOTHELD (lease ran out or message gone: nothing changed) or a
 * negative code.
 */
PQMQ_EXPORT int pqmq_checkpoint(pqmq_client *client, const uuid_t id, int64_t duration_ms,
                                const char *json, const void *bytes, size_t len,
                                int extra_retries);

/* ---- completing and polling at once (complete_poll.c) ------------------ */

/*
 * A consumer's loop in one statement: completes the jobs of done (as
 * pqmq_complete_batch, fenced by attempt), then polls as pqmq_poll, in one
 * round trip and one transaction, so one commit per batch instead of two.
 * done may be NULL or empty (a plain poll); it stays the caller's to free.
 * *out (caller frees with pqmq_batch_free) is set when the poll ran: on 0,
 * and on PQMQ_ESTALE (some of done's jobs were delivered again since and
 * were left to their new owner). On any other error neither took effect:
 * complete done again.
 */
PQMQ_EXPORT int pqmq_complete_and_poll(pqmq_client *client, const pqmq_batch *done,
                                       const char *const *channels, size_t nchannels,
                                       int batch_size, pqmq_batch **out);

/* ---- dead letters (dead.c) -------------------------------------------- */

/*
 * Lists up to max dead messages (ran out of attempts, never completed),
 * oldest first, of the given channels (NULL: all) as jobs: id, name,
 * channel, args, payload, pqmq_job_attempt (deliveries made),
 * pqmq_job_last_error and pqmq_job_blocking. Dead messages are kept until
 * completed (deleted), retried or skipped; new ones are announced with a
 * notification on "mq_dead". Caller owns *out; free with pqmq_batch_free.
 */
PQMQ_EXPORT int pqmq_dead_letters(pqmq_client *client, const char *const *channels,
                                  size_t nchannels, int max, pqmq_batch **out);
/* Gives dead messages retries more retries (retries + 1 deliveries), ready
 * now; a dead chain head is delivered again in its place. *count (may be
 * NULL) receives how many were dead and revived. */
PQMQ_EXPORT int pqmq_retry(pqmq_client *client, const uuid_t *ids, size_t n, int retries,
                           size_t *count);
/* Moves ordered messages out of their chains into the dead letters and
 * releases the next message of each chain. *count (may be NULL) receives
 * how many were moved. */
PQMQ_EXPORT int pqmq_skip(pqmq_client *client, const uuid_t *ids, size_t n, size_t *count);

/* ---- pausing a channel (pause.c) -------------------------------------- */

/*
 * Pauses the channel named channel (every args of that name): no poll, of
 * any lane or the runner, delivers its messages until pqmq_resume. What is
 * in flight can still be completed, failed or kept alive; a lease that runs
 * out while paused is not delivered again until then. Inserts go on. The
 * pause is kept in the queue, so it outlasts connections and restarts; a
 * name with no message yet may be paused. reason (may be NULL) is shown by
 * pqmq status. channel and reason stay the caller's. Returns 1 when the
 * channel was not paused before, 0 when it was (its first pause is kept),
 * or a negative error. Needs the administer duty.
 */
PQMQ_EXPORT int pqmq_pause(pqmq_client *client, const char *channel, const char *reason);
/* Resumes a paused channel and wakes its sleeping consumers. channel stays
 * the caller's. Returns 1 when it was paused, 0 when not, or a negative
 * error. Needs the administer duty. */
PQMQ_EXPORT int pqmq_resume(pqmq_client *client, const char *channel);

/* ---- the runner (runner.c; worker.c, claims.c) ------------------------- */

typedef struct pqmq_runner pqmq_runner;
typedef struct pqmq_ctx pqmq_ctx;

/*
 * A handler runs one job on a worker thread. Return 0 to complete the job,
 * anything else to fail it (retried after its backoff; see pqmq_ctx_error).
 * job and ctx are borrowed; valid until the handler returns.
 */
typedef int (*pqmq_handler)(pqmq_ctx *ctx, const pqmq_job *job, void *arg);

/*
 * A group handler runs several jobs of one message name at once, so that
 * one statement can do the work of them all (an INSERT of n rows through
 * pqmq_ctx_exec_params, say). With commit batches a worker hands it every
 * job of that name queued for it, up to the batch's room, under one
 * savepoint; otherwise n is 1. Return 0 to complete them all (with the
 * batch), anything else to fail them all, their writes undone; each is
 * retried after its own backoff. jobs (n entries) and ctx are borrowed;
 * valid until the handler returns.
 */
typedef int (*pqmq_group_handler)(pqmq_ctx *ctx, const pqmq_job *const *jobs, size_t n,
                                  void *arg);

/*
 * A worker that polls, runs handlers on a pool of threads (each with its own
 * connection), sleeps on LISTEN/NOTIFY between polls, keeps in-flight jobs
 * alive, batches completions, reconnects after a lost connection, and stops
 * gracefully. conninfo is copied; every connection the runner opens uses it.
 * Returns NULL if memory ran out. Caller owns; free with pqmq_runner_free
 * (after pqmq_runner_run has returned).
 */
PQMQ_EXPORT pqmq_runner *pqmq_runner_new(const char *conninfo);
PQMQ_EXPORT void pqmq_runner_free(pqmq_runner *runner);

/* Handles messages named name (NULL: the fallback for names without a
 * handler). A message with neither fails with "no handler". name is copied;
 * arg is passed through. Returns 0, PQMQ_EINVAL or PQMQ_ENOMEM. */
PQMQ_EXPORT int pqmq_runner_handle(pqmq_runner *runner, const char *name, pqmq_handler fn,
                                   void *arg);
/* As pqmq_runner_handle, with a group handler (see pqmq_group_handler). */
PQMQ_EXPORT int pqmq_runner_handle_group(pqmq_runner *runner, const char *name,
                                         pqmq_group_handler fn, void *arg);
/* Serves only these channels (copied; default: all channels). */
PQMQ_EXPORT int pqmq_runner_set_channels(pqmq_runner *runner, const char *const *channels,
                                         size_t n);
/* Worker threads = most jobs in flight at once (1..256; default 4). */
PQMQ_EXPORT int pqmq_runner_set_concurrency(pqmq_runner *runner, int threads);
/* Most jobs claimed per poll (1..PQMQ_MAX_BATCH; default 100). */
PQMQ_EXPORT int pqmq_runner_set_batch(pqmq_runner *runner, int batch_size);
/* Keep-alive period for in-flight jobs; each keep-alive extends every
 * in-flight lease by 3 periods. 0 (default): a third of the shortest lease
 * in flight. Returns 0 or PQMQ_EINVAL. */
PQMQ_EXPORT int pqmq_runner_set_keep_alive(pqmq_runner *runner, int64_t period_ms);
/*
 * The locked lane (see pqmq_poll_locked) for short handlers and
 * exactly-once work: on (non-zero), each worker claims its own batch (up to
 * the batch size, at most 64) in a transaction of its own and runs
 * the handlers in it; the successes are completed and committed together,
 * one commit per batch. pqmq_ctx_begin then returns that transaction,
 * under a savepoint, so a failing handler's writes are undone alone and its
 * attempt is counted; pqmq_ctx_conn is that transaction too, and
 * pqmq_ctx_checkpoint needs a lease (PQMQ_ENOTHELD). A crash or a lost
 * connection makes the batch ready again at once. Retries and messages
 * whose locked delivery died come through the lease lane as before (the
 * main loop claims them, at most every 250 ms), so a message that kills
 * its worker still ends dead. Off by default. Returns 0 or PQMQ_EINVAL.
 */
PQMQ_EXPORT int pqmq_runner_set_locked(pqmq_runner *runner, int on);
/*
 * Commit batches, for handlers that complete in their own transaction
 * (pqmq_ctx_begin): a worker's jobs share one transaction, each handler in
 * a savepoint, and their effects and completions commit together, once per
 * batch, not once per job. A failing handler's writes are rolled back to
 * its savepoint alone and it fails as usual (recorded after the commit).
 * The completion is fenced by attempt: if a job of the batch is no longer
 * this runner's (its lease ran out and it went elsewhere), the whole batch
 * rolls back and its other jobs are handed back at once to run again. A
 * batch ends when it holds max_jobs jobs (0: 64, the most), when it has
 * been open max_open_ms (0: 50 ms; at most 60000; checked between
 * handlers), when no job is waiting, or at a stop. max_jobs 1: each job
 * commits alone (the default). Not for the locked lane, which batches its
 * own way. Returns 0, or PQMQ_EINVAL with pqmq_runner_errmsg saying which
 * value is outside its range.
 */
PQMQ_EXPORT int pqmq_runner_set_commit_batch(pqmq_runner *runner, int max_jobs,
                                             int64_t max_open_ms);
/* Also stop when a notification arrives on this channel (1..63 bytes,
 * copied; NULL: no stop channel). E.g. SELECT pg_notify('my_stop', '').
 * Returns 0, PQMQ_EINVAL or PQMQ_ENOMEM. */
PQMQ_EXPORT int pqmq_runner_set_stop_channel(pqmq_runner *runner, const char *channel);
/* LISTEN on a connection of its own to conninfo (copied; NULL: on the
 * control connection, the default). For a pooler in transaction mode
 * (PgBouncer): the runner's conninfo goes through the pooler, this one
 * straight to the server, since a pooled connection cannot keep a LISTEN.
 * It only ever LISTENs. Returns 0, PQMQ_EINVAL (runner NULL) or
 * PQMQ_ENOMEM. */
PQMQ_EXPORT int pqmq_runner_set_listen_dsn(pqmq_runner *runner, const char *conninfo);

/*
 * Where the runner reports (fn NULL, the default: nowhere; the runner
 * prints nothing itself, and its connections' notices go to fn, not to
 * stderr). It logs, each line naming the runner's channels ("pqmq_runner
 * (channels: a, b)" or "(all channels)") and the connection:
 *   PQMQ_LOG_INFO  at start and at stop;
 *   PQMQ_LOG_WARN  "lost connection" with the error (the server's last
 *                  words when it sent any) and the delay before the next
 *                  attempt, and each failed attempt of the control
 *                  connection with its error and next delay;
 *   PQMQ_LOG_INFO  "reconnected after N ms" with the number of attempts;
 *   PQMQ_LOG_DEBUG a worker's failed attempts after its first;
 *   and the server's notices and warnings at their level (as pqmq_set_log).
 * fn is called from the thread running pqmq_runner_run and from the worker
 * threads, one call at a time (the runner holds a lock around each). ctx
 * is borrowed and passed through; it must outlive pqmq_runner_run. Set it
 * before pqmq_runner_run. Returns 0 or PQMQ_EINVAL (runner NULL).
 */
PQMQ_EXPORT int pqmq_runner_set_log(pqmq_runner *runner, pqmq_log_fn fn, void *ctx);

/*
 * Runs until pqmq_runner_stop (or the stop notification): then stops
 * claiming, lets in-flight handlers finish, saves their results and
 * returns 0. Returns a negative code (see pqmq_runner_errmsg) only when it
 * cannot start (no handler, cannot connect); a connection lost later is
 * re-established. Call it once per runner, from one thread.
 */
PQMQ_EXPORT int pqmq_runner_run(pqmq_runner *runner);

/* Asks the runner to stop. Safe from a signal handler and from any thread. */
PQMQ_EXPORT void pqmq_runner_stop(pqmq_runner *runner);

/* What a runner that was down over several slots of a schedule inserts. */
typedef enum {
    PQMQ_BACKFILL_ALL = 0,   /* every slot it missed (up to 31 days back) */
    PQMQ_BACKFILL_LATEST = 1 /* only the latest of them */
} pqmq_backfill;

/*
 * Recurring messages: while the runner runs, each slot of the cron
 * expression (five fields: minute hour day-of-month month day-of-week;
 * lists, ranges, steps, month and weekday names, @daily and the like) in
 * time_zone (an IANA name such as "Europe/Paris"; NULL: UTC) inserts a copy
 * of msg (its channel, name, payload, retries and backoff; a JSON object
 * payload gets "_slot": the local slot time "YYYY-MM-DDTHH:MM"). Each slot
 * is inserted once however many runners carry the same schedule name (a
 * unique key per slot decides). A schedule first seen starts now; a slot
 * the local clock skips (daylight saving) comes due right after the gap,
 * and a repeated one once. A schedule belongs to the role the runner
 * connects as that first evaluated it (another role's runner fails the
 * run), and evaluating one is the produce duty's. Checked here: a bad
 * expression is PQMQ_EINVAL, and pqmq_runner_errmsg names the field; so is
 * a name that is empty or over 998 bytes, and a payload that is not valid
 * JSON (the errmsg names the schedule); an unknown time zone fails
 * pqmq_runner_run. msg stays the caller's.
 */
PQMQ_EXPORT int pqmq_runner_schedule(pqmq_runner *runner, const char *name, const char *cron,
                                     const char *time_zone, const pqmq_msg *msg,
                                     pqmq_backfill backfill);

/*
 * The local wall-clock times ("YYYY-MM-DDTHH:MM") at which a cron
 * expression comes due in time_zone (NULL: UTC) after after_ms and up to
 * until_ms (Unix milliseconds, at most 31 days apart), computed by the
 * server as the runner's schedules are. Caller owns *slots (*n entries);
 * free with pqmq_cron_slots_free. A bad expression: PQMQ_EINVAL naming the
 * field.
 */
PQMQ_EXPORT int pqmq_cron_slots(pqmq_client *client, const char *cron, const char *time_zone,
                                int64_t after_ms, int64_t until_ms, char ***slots, size_t *n);
PQMQ_EXPORT void pqmq_cron_slots_free(char **slots, size_t n);

/* Why pqmq_runner_run failed. Borrowed; valid until the runner is freed. */
PQMQ_EXPORT const char *pqmq_runner_errmsg(const pqmq_runner *runner);

typedef struct {
    uint64_t processed;  /* jobs completed */
    uint64_t failed;     /* jobs failed (handler error, no handler, rollback) */
    uint64_t in_flight;  /* jobs claimed and not yet settled: running or queued */
    uint64_t polls;      /* poll statements run */
    uint64_t wakeups;    /* notifications received */
    uint64_t reconnects; /* connections re-established */
} pqmq_runner_stats_t;

/* A consistent-enough snapshot of the counters; callable from any thread
 * while the runner runs. */
PQMQ_EXPORT void pqmq_runner_stats(const pqmq_runner *runner, pqmq_runner_stats_t *out);

/*
 * Transactional completion: returns the worker's connection with a
 * transaction open. Do your writes on it (do not COMMIT or ROLLBACK); when
 * the handler returns 0 the runner completes the job in that same
 * transaction and commits, so the writes happen exactly once even if the
 * process dies at any point. Returning non-zero (or losing the lease to
 * another consumer) rolls everything back. Borrowed; valid until the
 * handler returns. NULL if the connection is unusable.
 */
PQMQ_EXPORT PGconn *pqmq_ctx_begin(pqmq_ctx *ctx);
/*
 * Runs one statement in the job's transaction, as PQexecParams would on
 * pqmq_ctx_begin's connection (text parameters, text results), or
 * PQexecPrepared with a statement prepared on pqmq_ctx_conn. If the job's
 * transaction is not open yet, what opens it (BEGIN; in a commit batch or
 * the locked lane, the job's savepoint) goes out with the statement, in one
 * round trip instead of two: a handler whose first statement is this pays
 * no round trip of its own for exactly-once. A failed statement aborts the
 * job's transaction (its savepoint) as usual: the handler should fail.
 * Returns the statement's result, owned by the caller (PQclear), or NULL
 * when the job's transaction could not be opened or an argument is NULL.
 */
PQMQ_EXPORT PGresult *pqmq_ctx_exec_params(pqmq_ctx *ctx, const char *sql, int nparams,
                                           const char *const *values);
PQMQ_EXPORT PGresult *pqmq_ctx_exec_prepared(pqmq_ctx *ctx, const char *name, int nparams,
                                             const char *const *values);
/* The worker's connection for reads or writes outside the job's
 * transaction. Borrowed; valid until the handler returns. */
PQMQ_EXPORT PGconn *pqmq_ctx_conn(pqmq_ctx *ctx);
/* Sets the error text recorded when the handler fails (printf-style). */
PQMQ_EXPORT void pqmq_ctx_error(pqmq_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Saves progress (see pqmq_checkpoint); the lease is extended by the job's
 * lease length. Returns 0, PQMQ_ENOTHELD or a negative code; PQMQ_EINVAL
 * in a group handler given several jobs (whose progress would it be?). */
PQMQ_EXPORT int pqmq_ctx_checkpoint(pqmq_ctx *ctx, const char *json, const void *bytes,
                                    size_t len, int extra_retries);
/* Non-zero once the runner has been asked to stop: a long handler may
 * checkpoint and return early. */
PQMQ_EXPORT int pqmq_ctx_stopping(const pqmq_ctx *ctx);

/* ---- payloads (payload.c) ---------------------------------------------- */

/*
 * Checks that data[0..len) is exactly one well-formed msgpack object whose
 * declared sizes fit in len and whose nesting is at most 32 deep (msgpack-c
 * 4.0's own limit), then
 * unpacks it into *out (initialise with msgpack_unpacked_init).
 * Returns 0 or PQMQ_EPAYLOAD (truncated, trailing bytes, hostile sizes).
 * Caller owns out's zone; release with msgpack_unpacked_destroy.
 */
PQMQ_EXPORT int pqmq_unpack(const void *data, size_t len, msgpack_unpacked *out);

/* pqmq_unpack of a job's binary payload (payload_job.c). */
PQMQ_EXPORT int pqmq_job_unpack(const pqmq_job *job, msgpack_unpacked *out);

/* Looks up key (a msgpack str) in a map object. Borrowed from obj; NULL when
 * obj is no map or has no such key. */
PQMQ_EXPORT const msgpack_object *pqmq_map_get(const msgpack_object *obj, const char *key);

/* ---- ids (uuid.c) ------------------------------------------------------ */

/* A new time-ordered id (UUIDv7 layout: 48-bit Unix milliseconds, 12 bits
 * of sub-millisecond time, 62 random bits), so that ids made later in a
 * process sort later. Thread-safe and fork-safe; about 60 ns. */
PQMQ_EXPORT void pqmq_uuid_generate(uuid_t out);

/* ---- JSON (json.c) ----------------------------------------------------- */

/* Checks that text[0..len) is one JSON value (RFC 8259). Returns 0, or the
 * 1-based byte offset where it stops being valid JSON. */
PQMQ_EXPORT size_t pqmq_json_check(const char *text, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* PQMQ_H */
