"""Chat rows shaped like the ones the daemon stores from Twitch, made by the server: the
storage benchmark's data and the tests that compare storage settings on it.

What makes them realistic (each choice matters to how they compress):

- Accounts by Zipf's law: account k gets a share of the rows proportional to k^-s
  (s = 1): a few busy channels, a long tail of quiet ones.
- Chat only while an account is live: each account streams on about half of the
  days, once a day, 2 to 6 hours from a random hour; its rows fall uniformly into
  its streams. A quiet account's day of chat is therefore a handful of rows, as it
  is in production.
- Rows as `map_chat` (lumio_ingestd.sources.twitch.mapping) stores a
  `channel.chat.message`: a random UUID as message id, a numeric user id from a
  pool per account (busy accounts have more chatters, some chat far more than
  others), a login of 5 to 13 characters and its capitalised display name, a
  text of 1 to 13 words, 15 % ending in a native emote, and `extras` with
  `message_type`, the chatter's `color` (none for three in ten), their 0 to 2
  `badges`, `broadcaster_user_id`, the `fragments` (the text again, and the emote
  fragment) and, for one in twenty, a `reply` with the parent's ids and users.

Rows are inserted in time order, as ingest writes them (so chunks are created
oldest first). The same arguments give the same rows (`setseed`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

WORDS = ("lol", "gg", "KEKW", "PogChamp", "LUL", "nice", "what", "is", "this", "the", "stream",
         "hello", "hi", "chat", "omg", "no", "yes", "that", "was", "so", "good", "bad", "play",
         "again", "clip", "it", "haha", "W", "L", "monkaS", "Kappa", "OMEGALUL", "love", "you",
         "streamer", "game", "boss", "first", "try", "when", "raid", "sub", "hype", "let's", "go")
# Twitch's global emotes and their ids, as an emote fragment carries them.
EMOTES = (("Kappa", "25"), ("PogChamp", "305954156"), ("LUL", "425618"), ("BibleThump", "86"),
          ("SeemsGood", "64138"), ("HeyGuys", "30259"), ("NotLikeThis", "58765"), ("Kreygasm", "41"))

# A user's fields follow from their id (the same chatter has the same login, colour
# and badges in every row); {u} is the id.
_LOGIN = "substr(md5(({u})::text), 1, 5 + (({u}) %% 9)::int)"

_FILL = """
SELECT setseed(%(seed)s);
WITH weights AS (SELECT k, power(k, -%(zipf)s) AS w FROM generate_series(1, %(accounts)s) k),
     floored AS (SELECT k, floor(%(rows)s * w / sum(w) OVER ())::bigint AS n FROM weights),
     counts AS (SELECT k, (n + CASE WHEN k = 1 THEN %(rows)s - sum(n) OVER () ELSE 0 END)::bigint AS n
                  FROM floored),
     streams AS (SELECT k, row_number() OVER (PARTITION BY k ORDER BY d) AS i,
                        count(*) OVER (PARTITION BY k) AS streams,
                        %(start)s::timestamptz + d * interval '1 day' + random() * interval '18 hours' AS at,
                        interval '2 hours' + random() * interval '4 hours' AS length
                   FROM generate_series(1, %(accounts)s) k, generate_series(0, %(days)s - 1) d
                  WHERE random() < %(live)s OR d = k %% %(days)s),
     picked AS (SELECT c.k, c.n, 1 + floor(random() * s.streams)::bigint AS i
                  FROM counts c JOIN (SELECT DISTINCT k, streams FROM streams) s USING (k),
                       generate_series(1, c.n) g),
     timed AS (SELECT p.k, p.n, s.at + random() * s.length AS created_at
                 FROM picked p JOIN streams s USING (k, i)
                ORDER BY 3)
INSERT INTO chat_messages (account_id, platform, message_id, created_at, user_id, user_login,
                           display_name, text, extras)
SELECT t.k, 'twitch', md5(random()::text)::uuid::text, t.created_at,
       u.id::text, u.login, initcap(u.login), m.text,
       jsonb_build_object(
           'message_type', 'text',
           'color', CASE WHEN u.id %% 10 < 7
                         THEN '#' || lpad(to_hex((u.id * 2654435761) %% 16777216), 6, '0') ELSE '' END,
           'badges', CASE u.id %% 5
               WHEN 0 THEN '[]'::jsonb
               WHEN 1 THEN jsonb_build_array(u.sub)
               WHEN 2 THEN jsonb_build_array(u.sub, jsonb_build_object('set_id', 'sub-gifter', 'id', '5',
                                                                       'info', ''))
               WHEN 3 THEN jsonb_build_array(jsonb_build_object('set_id', 'premium', 'id', '1', 'info', ''))
               ELSE jsonb_build_array(jsonb_build_object('set_id', 'vip', 'id', '1', 'info', ''), u.sub)
               END,
           'broadcaster_user_id', (777000 + t.k)::text,
           'fragments', CASE WHEN m.emote IS NULL
               THEN jsonb_build_array(jsonb_build_object('type', 'text', 'text', m.text, 'cheermote', NULL,
                                                         'emote', NULL, 'mention', NULL))
               ELSE jsonb_build_array(
                   jsonb_build_object('type', 'text', 'text', m.words || ' ', 'cheermote', NULL,
                                      'emote', NULL, 'mention', NULL),
                   jsonb_build_object('type', 'emote', 'text', m.emote, 'cheermote', NULL, 'mention', NULL,
                                      'emote', jsonb_build_object('id', m.emote_id, 'emote_set_id', '0',
                                                                  'owner_id', '0',
                                                                  'format', jsonb_build_array('static'))))
               END)
       || CASE WHEN r.parent IS NULL THEN '{}'::jsonb
               ELSE jsonb_build_object('reply', jsonb_build_object(
                   'parent_message_id', r.parent, 'parent_message_body', 'gg',
                   'parent_user_id', r.id::text, 'parent_user_login', r.login,
                   'parent_user_name', initcap(r.login), 'thread_message_id', r.parent,
                   'thread_user_id', r.id::text, 'thread_user_login', r.login,
                   'thread_user_name', initcap(r.login)))
               END
  FROM timed t,
       -- chatters: a pool per account growing with its traffic, some chatting far more
       LATERAL (SELECT 100000000 + t.k * 100003
                       + floor(power(random(), 2) * greatest(20, t.n / 30))::int AS id) u0,
       LATERAL (SELECT u0.id, {user_login} AS login,
                       jsonb_build_object('set_id', 'subscriber', 'id', ((u0.id / 5) %% 24 + 1)::text,
                                          'info', ((u0.id / 5) %% 30 + 1)::text) AS sub) u,
       LATERAL (SELECT (SELECT string_agg((%(words)s::text[])[1 + floor(random() * %(nwords)s)::int], ' ')
                          FROM generate_series(1, 1 + floor(random() * 13)::int + 0 * t.k)) AS words,
                       CASE WHEN random() < 0.15 THEN 1 + floor(random() * %(nemotes)s)::int END AS e) m0,
       LATERAL (SELECT m0.words, (%(emotes)s::text[])[m0.e] AS emote,
                       (%(emote_ids)s::text[])[m0.e] AS emote_id,
                       m0.words || coalesce(' ' || (%(emotes)s::text[])[m0.e], '') AS text) m,
       LATERAL (SELECT CASE WHEN random() < 0.05 THEN md5(random()::text)::uuid::text END AS parent,
                       100000000 + t.k * 100003 + floor(random() * greatest(20, t.n / 30))::int AS id) r0,
       LATERAL (SELECT r0.parent, r0.id, {parent_login} AS login) r
""".replace("{user_login}", _LOGIN.format(u="u0.id")).replace(
    "{parent_login}", _LOGIN.format(u="r0.id"))


def fill_chat(cur: Any, *, rows: int, accounts: int, days: int, start: datetime,
              seed: float = 0.42) -> None:
    """Insert `rows` chat rows over `accounts` accounts and `days` days from `start`
    (see the module docstring), with the cursor's connection, in its transaction."""
    cur.execute(_FILL, {
        "seed": seed, "zipf": 1.0, "live": 0.5, "accounts": accounts, "rows": rows,
        "start": start, "days": days, "words": list(WORDS), "nwords": len(WORDS),
        "emotes": [e for e, _ in EMOTES], "emote_ids": [i for _, i in EMOTES], "nemotes": len(EMOTES)})
