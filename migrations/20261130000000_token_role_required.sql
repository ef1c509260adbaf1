-- A token is made with the role its maker chose: no default (an INSERT naming none fails).
ALTER TABLE api_token ALTER COLUMN role DROP DEFAULT;
